/* ts_xchg_dump (xchg_dump.h). */
#include "support/xchg_dump.h"

void ts_xchg_dump(const ts_xchg *x, const ts_schedule *s, FILE *f)
{
    char buf[64], cell[32];
    fprintf(f, "exchange program of \"%s\" (pp = %d, v = %d, m = %d): %d ops; each step: "
               "its group | its action\n",
            s->name, s->pp, s->v, s->m, ts_xchg_total_ops(x));
    for (int r = 0; r < x->pp; r++) {
        fprintf(f, "rank %d:\n", r);
        for (int k = 0; k < x->n_steps[r]; k++) {
            const ts_xchg_step *st = &x->steps[r][k];
            if (st->action < 0 && st->n_ops == 0) continue; /* nothing left to send */
            fprintf(f, "  %3d: ", k);
            for (int i = 0; i < st->n_ops; i++)
                fprintf(f, "%s%s", i ? ", " : "", ts_xchg_op_str(buf, sizeof buf, &st->ops[i]));
            fprintf(f, "%s| %s\n", st->n_ops ? " " : "",
                    st->action >= 0
                        ? ts_action_cell(cell, sizeof cell, s->actions[r][st->action])
                        : "end");
        }
    }
}
