/* The names of the pipeline options the config accepts: the built-in schedules
 * (parallel.schedule) and the recompute modes (parallel.recompute), with the rule of how
 * many chunks per rank (parallel.virtual_stages) each schedule runs. They live here, in
 * config/, so that the config checks know them without including pipeline/ (which
 * includes config/); pipeline/schedule.h includes this header and builds the schedules
 * these names name. Includes only core/. */
#ifndef TS_CONFIG_PIPELINE_NAMES_H
#define TS_CONFIG_PIPELINE_NAMES_H

#include "core/error.h"

/* The built-in pipeline schedules: one name table, read by the config checks, the
 * schedule builders (pipeline/schedule.c), the engine, the memory estimate and plan. */
typedef enum {
    TS_SCHEDULE_GPIPE,
    TS_SCHEDULE_1F1B,
    TS_SCHEDULE_INTERLEAVED_1F1B,
    TS_SCHEDULE_ZB_H1,
    TS_SCHEDULE_LOOPED_BFS,
    TS_SCHEDULE_INTERLEAVED_ZB,
    TS_SCHEDULE_ZB_H2,
    TS_SCHEDULE_ZB_V,
    TS_SCHEDULE_DUALPIPE_V,
    TS_N_SCHEDULES
} ts_schedule_kind;
extern const char *const ts_schedule_names[TS_N_SCHEDULES]; /* "gpipe", "1f1b", ... */
/* The built-in schedule `name` names, or -1 (a CSV path, or not a schedule). */
int ts_schedule_kind_from_name(const char *name);
/* Chunks per rank (parallel.virtual_stages) a built-in schedule runs: 1 (exactly one),
 * 2 (exactly two: the V placement of zb-v and dualpipe-v) or 0 (any v >= 1). */
int ts_schedule_chunks_per_rank(ts_schedule_kind kind);
/* TS_OK when `kind` runs v chunks per rank; otherwise a message naming the rule and the
 * schedules that do (the config check and ts_schedule_build both ask). */
ts_status ts_schedule_check_virtual_stages(ts_schedule_kind kind, int v);

/* The recompute modes (parallel.recompute): what a chunk keeps of each micro-batch's
 * forward for its backward. */
typedef enum {
    TS_RECOMPUTE_NONE,
    TS_RECOMPUTE_EXCEPT_LAST,
    TS_RECOMPUTE_FULL,
    TS_RECOMPUTE_AUTO, /* per chunk, as many micro-batches as the memory budget needs
                          (pipeline/memory.h ts_memory_auto_keep_selective) */
    TS_RECOMPUTE_SELECTIVE, /* every micro-batch keeps its activations but attention's
                               saved state (the [B,H,T,T] probabilities), which each
                               block's backward recomputes (Korthikanti et al. 2022) */
    TS_N_RECOMPUTES
} ts_recompute;
extern const char *const ts_recompute_names[TS_N_RECOMPUTES]; /* "none", "except_last", "full",
                                                                 "auto", "selective" */
/* The mode `name` names, or -1. */
int ts_recompute_from_name(const char *name);

#endif
