/* Packed documents (data.document_mask; docs/ARCHITECTURE.md "Packed documents"): a
 * micro-batch's document starts from its whole input windows, in the three forms the
 * layers read (model.h ts_acts): attention's first visible key per local query
 * (doc_start, in the kernels' key coordinates), RoPE's rows at the restarted positions
 * (doc_cos, doc_sin) and the runs of local rows the embedding gathers and scatters gpt2's
 * position rows by (doc_seg). Computed on the host from the windows every rank already
 * reads, uploaded once per micro-batch. */
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_sizes.h"
#include "model/act_layout.h"
#include "model/model.h"

#define ALIGN64(x) (((x) + 63) / 64 * 64)

/* A range with gpt2's embedding gathers its position rows into doc_wpe. */
static bool gathers_wpe(const ts_model *m, int l0) { return l0 == 0 && m->arch != TS_ARCH_LLAMA; }
static bool ropes(const ts_model *m) { return m->arch == TS_ARCH_LLAMA; }

size_t ts_acts_documents_bytes(const ts_model *m, int l0, int l1, int B, int T)
{
    (void)l1;
    if (m->doc_token < 0) return 0;
    const size_t N = (size_t)B * T, half = (size_t)m->rope_dim / 2;
    size_t bytes = ALIGN64(N * sizeof(int));
    if (ropes(m)) bytes += 2 * ALIGN64(N * half * sizeof(float));
    if (gathers_wpe(m, l0)) bytes += ALIGN64(N * (size_t)m->n_embd * sizeof(float));
    return bytes;
}

/* Called by ts_acts_init: the buffers above, and the host's. */
void ts_acts_documents_init(const ts_model *m, ts_acts *a)
{
    if (m->doc_token < 0) return;
    const size_t N = (size_t)a->B * a->T, half = (size_t)m->rope_dim / 2;
    a->doc_start = m->k->dev_alloc(N * sizeof(int));
    if (ropes(m)) {
        a->doc_cos = m->k->dev_alloc(N * half * sizeof(float));
        a->doc_sin = m->k->dev_alloc(N * half * sizeof(float));
    }
    if (gathers_wpe(m, a->l0)) a->doc_wpe = m->k->dev_alloc(N * (size_t)m->n_embd * sizeof(float));
    /* At most one run per local row; the whole windows' starts, then the local rows'. */
    a->doc_seg = ts_calloc(3 * N, sizeof(int));
    a->doc_host = ts_calloc((size_t)a->B * a->T * m->cp.size + N, sizeof(int));
}

void ts_acts_documents_free(ts_acts *a)
{
    if (a->k) {
        a->k->dev_free(a->doc_start);
        a->k->dev_free(a->doc_cos);
        a->k->dev_free(a->doc_sin);
        a->k->dev_free(a->doc_wpe);
    }
    free(a->doc_seg);
    free(a->doc_host);
}

void ts_acts_set_documents(const ts_model *m, ts_acts *a, const int *tokens_host, int seq_len)
{
    if (m->doc_token < 0) return;
    const ts_cp *cp = &m->cp;
    const int B = a->B, Tl = a->T;
    TS_ASSERT(seq_len == Tl * cp->size && a->doc_start);
    int *start = a->doc_host, *local = a->doc_host + (size_t)B * seq_len;
    /* Each window position's document start: the last document token at or before it,
     * or the window's first position (a document cut by the window's start). */
    a->doc_pairs = 0.0;
    for (int b = 0; b < B; b++) {
        const int *tok = tokens_host + (size_t)b * seq_len;
        int *st = start + (size_t)b * seq_len;
        int s = 0;
        for (int p = 0; p < seq_len; p++) {
            if (tok[p] == m->doc_token) s = p;
            st[p] = s;
        }
        a->doc_pairs += ts_attention_pairs(st, seq_len);
    }
    /* Local query t of sequence b attends keys from its position's document start: the
     * window's own positions are the key coordinates (under context parallelism the
     * gathered keys are the whole window in position order: tensor/cp.h). */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++) {
            const int p = cp->size > 1 ? ts_cp_position(cp, t) : t;
            local[(size_t)b * Tl + t] = start[(size_t)b * seq_len + p];
        }
    m->k->memcpy_h2d(a->doc_start, local, (size_t)B * Tl * sizeof(int));
    /* Runs of local rows at consecutive positions of one document: a new run at each
     * sequence's first row, at a chunk boundary (context parallelism) and at each
     * document start. */
    int n = 0;
    for (int b = 0; b < B; b++) {
        int prev = -2;
        for (int t = 0; t < Tl; t++) {
            const int p = cp->size > 1 ? ts_cp_position(cp, t) : t;
            const int s = start[(size_t)b * seq_len + p];
            const int row = b * Tl + t;
            if (t == 0 || p != prev + 1 || s == p) {
                a->doc_seg[3 * n] = row;
                a->doc_seg[3 * n + 1] = 0;
                a->doc_seg[3 * n + 2] = p - s;
                n++;
            }
            a->doc_seg[3 * (n - 1) + 1]++;
            prev = p;
        }
    }
    a->n_doc_seg = n;
    /* RoPE's rows at the restarted positions, one copy per run from the whole tables. */
    if (a->doc_cos) {
        const size_t half = (size_t)m->rope_dim / 2, rb = half * sizeof(float);
        const float *cos_all = m->rope_cos_all ? m->rope_cos_all : m->rope_cos;
        const float *sin_all = m->rope_sin_all ? m->rope_sin_all : m->rope_sin;
        TS_ASSERT(cos_all && sin_all);
        for (int i = 0; i < n; i++) {
            const int *g = a->doc_seg + 3 * i;
            m->k->memcpy_d2d(a->doc_cos + (size_t)g[0] * half, cos_all + (size_t)g[2] * half,
                             (size_t)g[1] * rb);
            m->k->memcpy_d2d(a->doc_sin + (size_t)g[0] * half, sin_all + (size_t)g[2] * half,
                             (size_t)g[1] * rb);
        }
    }
}
