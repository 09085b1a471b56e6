/* The exchange program as text, one line per step (tests and debugging; the trainer and
 * the planner never print it). */
#ifndef TS_TEST_SUPPORT_XCHG_DUMP_H
#define TS_TEST_SUPPORT_XCHG_DUMP_H

#include <stdio.h>

#include "pipeline/exchange.h"

/* Print x, the exchange program of schedule s, to f: a title line, then per rank one line
 * per step, "  3: send act(c1,mb2)->1, recv grad(c0,mb0)<-1 | 0B0" (its group of ops,
 * then its action; "end" after the last action). */
void ts_xchg_dump(const ts_xchg *x, const ts_schedule *s, FILE *f);

#endif
