/*
 * fuzz_layout.h - what the parts of the fuzz_layout harness share:
 * fuzz_layout.c (grid, validation, conversions, attention) and
 * fuzz_layout_builders.c (the pattern builders).
 */
#ifndef SK_FUZZ_LAYOUT_H
#define SK_FUZZ_LAYOUT_H

#include "fz_layout_ref.h"
#include "layout_case.h"
#include "sparsek.h"

/* Grids whose dense block count is above this are not built. */
enum { FL_DENSE_CAP = 1 << 14 };

/* A handle value no builder returns: *out must keep it on failure. */
sk_layout_t fl_sentinel(void);

/* A handle the builder `api` returned: its view, valid by the independent
 * checker and over `grid`; the caller destroys the handle. */
void fl_view_checked(sk_layout_t out, const sk_grid *grid, const char *api, sk_bsr *view);

/* Every builder on the case's grid and parameters. */
void fl_check_builders(const layout_case *k, const fz_grid_ref *g);

#endif /* SK_FUZZ_LAYOUT_H */
