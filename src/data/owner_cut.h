/* Owner-aligned cuts of a gradient bucket (Megatron's layer-wise distributed optimizer,
 * torchtitan's Muon ownership): a bucket is cut into one contiguous piece per member of
 * its reduction group, as ZeRO's even cuts do, except that some parameters must stay
 * whole in one member's piece, each weighing a cost (Muon's matrices: an update needs the
 * whole matrix, and its Newton-Schulz iteration costs ts_muon_ns_cost of its shape).
 *
 * Member r's piece precedes member r+1's, so the whole items a bucket gives its members
 * are a monotone assignment: a run of items to member 0, the next run to member 1, and so
 * on (runs may be empty). Over a run of buckets the cuts balance each member's cumulative
 * cost (`load`, carried from bucket to bucket): each bucket's assignment minimises the sum
 * over members of (load + the bucket's cost given to it)^2, an exact dynamic programme
 * over (member, items), so the loads' spread shrinks bucket by bucket; ties go to the
 * assignment giving earlier members fewer items. The floats between whole items (norms,
 * biases: split anywhere) fall where the even cut would put them, as far as the whole
 * items allow. Pure arithmetic: the same inputs give the same cuts on every rank. */
#ifndef TS_DATA_OWNER_CUT_H
#define TS_DATA_OWNER_CUT_H

#include <stddef.h>

/* A parameter kept whole: floats [begin, end) of the bucket (from its start), and its
 * cost (> 0). */
typedef struct {
    size_t begin, end;
    double cost;
} ts_whole_item;

/* Cut a bucket of `len` floats into n pieces (counts[n], displs[n]: member r's piece is
 * [displs[r], displs[r] + counts[r])), the whole items (k of them, ascending and
 * disjoint) each inside one piece: owner[i] is the member holding item i. Cuts between
 * whole items fall on multiples of `align` floats where the items allow (the even cut
 * clamped between the items around it). load[n] is each member's cost so far, to which
 * this bucket's costs are added. With k = 0 the cuts are the even ones and load is
 * unchanged. */
void ts_owner_cut(int n, size_t len, size_t align, const ts_whole_item *items, int k,
                  double *load, int *counts, int *displs, int *owner);

/* The even cut (k = 0 above): n pieces on `align` boundaries, the last taking any ragged
 * end. */
void ts_even_cut(int n, size_t len, size_t align, int *counts, int *displs);

#endif
