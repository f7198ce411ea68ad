/* Placeholder until the layout builders land: see layout_validate.c for the checks. */
#include "core/internal.h"
#include "core/layout.h"

typedef int sk_layout_placeholder;
