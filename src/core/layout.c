/* STUB: replaced by the layout work. */
#include "core/internal.h"
#include "core/layout.h"
sk_status sk_layout_check(const sk_bsr *layout) { (void)layout; return sk_error(SK_STATUS_INTERNAL_ERROR, "stub"); }
