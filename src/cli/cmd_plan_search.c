/* tessera plan --cluster: predict a config's grid on a described cluster, or search
 * every grid for N devices (src/plan/). */
#include "cli/cmd_plan_search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/plan_cli.h"
#include "config/config.h"
#include "core/log.h"
#include "core/sysmem.h"
#include "core/timer.h"
#include "plan/cluster.h"
#include "plan/predict.h"
#include "plan/search.h"

const char ts_plan_cluster_help[] =
    "\n"
    "usage: tessera plan CONFIG --cluster FILE [--set KEY=VALUE ...] [--json]\n"
    "       tessera plan CONFIG --cluster FILE --gpus N --search [--top K] [--exhaustive]\n"
    "                    [--set KEY=VALUE ...] [--json]\n"
    "\n"
    "Predict on a described cluster (configs/clusters/NAME.cfg: devices per node, peak FLOP/s,\n"
    "GEMM efficiency by size, memory and its bandwidth, intra- and inter-node links) instead\n"
    "of this machine. Without --search: the config's own grid (world = pp * dp * cp * tp\n"
    "devices, ranks in tp-cp-dp-pp order, devices_per_node consecutive ranks per node):\n"
    "memory per device, step time, tokens/s, MFU and bubble. With --gpus N --search: every\n"
    "valid grid for N devices (pp * dp * cp * tp = N; tp dividing model.n_head and the MLP\n"
    "width, and for llama dividing n_kv_head or a multiple of it; cp a power of two with\n"
    "seq_len dividing by 2 * cp; dp dividing\n"
    "train.global_batch; pp * virtual_stages <= n_layer + 2; micro_batch dividing\n"
    "global_batch / dp; gpipe, 1f1b, zb-h1, interleaved-1f1b with v >= 2; recompute none or\n"
    "full; zero 0 to 3; sequence parallelism off, and on where tp > 1 divides seq_len),\n"
    "ranked by step time among those that fit in memory; the top K (default 10), the best\n"
    "as config lines (parallel.sequence_parallel = true, parallel.cp = N where they win)\n"
    "and, for the rest,\n"
    "why they lose: out of memory (how many, and the smallest excess) or the term of\n"
    "their step that exceeds the best's most (bubble, communication, recompute, compute,\n"
    "optimizer).\n"
    "\n"
    "  --cluster FILE     the cluster description (libconfig; configs/clusters/ has examples;\n"
    "                     every key required but two: device.elementwise_ns = { gelu =\n"
    "                     [fwd, bwd]; layernorm = [fwd, bwd]; } prices those kernels per\n"
    "                     element where they are compute-bound (CPUs), and overlap_comm =\n"
    "                     false charges the dp reduction to the compute lane (CPUs, where\n"
    "                     MPI progresses on the compute cores))\n"
    "  --gpus N           devices to plan for, 1 to 100000000 (with --search)\n"
    "  --search           search the grids instead of predicting the config's own\n"
    "  --top K            grids listed, 1 to 1000 (default 10)\n"
    "  --exhaustive       simulate every grid that fits (default: simulate in order of a\n"
    "                     lower bound and stop once no other grid can enter the top K; the\n"
    "                     top K are the same, only slower to find)\n"
    "  --moe-imbalance X  an MoE model's load imbalance, 1 to 1000 (default 1, balanced): the\n"
    "                     slowest ep rank's routed rows over the balanced share; with ep > 1\n"
    "                     its expert GEMMs and SwiGLU scale by X\n"
    "  --moe-no-shared-overlap\n"
    "                     the shared experts hide none of the all-to-all (default: their\n"
    "                     compute hides it up to its own time)\n"
    "  --doc-len N        packed documents (data.document_mask): documents of N tokens, 1 to\n"
    "                     1000000000, fill every window from its start (the last one cut by\n"
    "                     the window's end; N >= seq_len: one per window). Attention's time\n"
    "                     is the kernels' over the documents (the CPU tables skip the earlier\n"
    "                     documents' key blocks; the CUDA batched GEMMs compute the whole\n"
    "                     square either way, and train.attention = \"flash\" is priced as they\n"
    "                     are) and MFU's attention FLOPs count the pairs the documents attend,\n"
    "                     sum L(L+1)/2 (default: no documents, the T x T square)\n"
    "  --json             one JSON object on stdout. Prediction: {\"cluster\", \"world\",\n"
    "                     \"pp\", \"dp\", \"tp\", \"cp\", \"ep\", \"etp\", \"v\", \"schedule\",\n"
    "                     \"micro_batch\",\n"
    "                     \"microbatches\", \"recompute\", \"zero\", \"sequence_parallel\",\n"
    "                     \"partition\", \"step_ms\",\n"
    "                     \"bubble\", \"tokens_per_s\", \"mfu\", \"fits\", \"memory_bytes\",\n"
    "                     \"memory_rank\", \"memory\": {\"parameters\", \"gradients\", \"optimizer\",\n"
    "                     \"activations\", \"activation_sets\", \"buffers\", \"workspace\"},\n"
    "                     \"terms_ms\": {\"compute\", \"recompute\", \"tp_comm\", \"cp_comm\",\n"
    "                     \"optimizer\",\n"
    "                     \"bubble\", \"dp_exposed\", \"dp_reduction\", \"pp_message\"}}.\n"
    "                     Search: {\"gpus\", \"cluster\", \"grids\", \"candidates\", \"fit\",\n"
    "                     \"simulated\", \"seconds\", \"best\": <prediction>, \"top\": [...],\n"
    "                     \"rejected\": {\"out_of_memory\": {\"count\", \"min_over_bytes\"},\n"
    "                     \"bubble\", \"communication\", \"recompute\", \"compute\", \"optimizer\",\n"
    "                     \"bound_auto\": recompute auto grids kept out by their bound before\n"
    "                     their caps were fitted (0 with --exhaustive), \"bound_cp\":\n"
    "                     context-parallel (grid, micro_batch) shapes skipped whole, their\n"
    "                     work floor above the K-th best step (0 with --exhaustive)}}\n"
    "\n"
    "GEMMs run in bf16 when train.precision = \"bf16\" (at the file's peak_tflops.bf16; an\n"
    "error where it has none) or the cluster file's compute_dtype is \"bf16\" (the GPU\n"
    "files: their runs are bf16 whatever train.precision says), else in fp32; the GEMM\n"
    "efficiency table is the file's one either way, and activations, pipeline messages\n"
    "and tp sums move in that dtype. train.device and train.attention choose the kernel\n"
    "table whose layout sizes memory: on a GPU cluster give\n"
    "--set train.device='\"cuda\"' (and --set train.attention='\"flash\"' for the flash\n"
    "kernel, one fp32 log-sum-exp per row\n"
    "instead of the [B, heads, T, T] probabilities); the default \"cpu\" lays out the CPU's\n"
    "attention. A CUDA config plans alike in every build that accepts it.\n"
    "\n"
    "The model (what Tessera does today, not an ideal framework): a GEMM (m, n, k) takes\n"
    "2mnk / (peak of that dtype * efficiency(cbrt(mnk))); elementwise work its bytes\n"
    "/ memory bandwidth; each block 2 tp all-reduces forward and 2 backward (ring: 2(t-1)/t\n"
    "* bytes / bandwidth + 2(t-1) latencies) on the intra-node link when the tp group lies\n"
    "in a node, else inter-node (parallel.sequence_parallel: forward 2 reduce-scatter +\n"
    "all-gather pairs, the same bytes; backward 3 all-reduces' worth, the norms gathered\n"
    "again for their weight gradients; norms, residuals and pipeline messages on seq_len /\n"
    "tp rows); parallel.cp: every layer on seq_len / cp rows, each local chunk's queries\n"
    "against their causal prefix, and per block a blocking all-gather of the keys and\n"
    "values over the cp group forward and a reduce-scatter of their gradients backward\n"
    "(intra-node when tp * cp devices lie in a node); the gradients reduced and ZeRO's\n"
    "shards over dp * cp ranks; pipeline messages and the dp reduction (a ring all-reduce\n"
    "of fp32 gradients in parallel.bucket_mb buckets, ZeRO-1/2: reduce-scatter, then the\n"
    "parameter all-gather after the optimizer; ZeRO-3: reduce-scatter, and each chunk's\n"
    "weights all-gathered when resident, prefetched one residency ahead) through the simulator, which hides what\n"
    "the bubbles and later compute can (none with overlap_comm = false); AdamW at memory\n"
    "bandwidth. Memory follows the trainer's own accounting (pipeline/memory.c): fp32\n"
    "parameters, gradients and AdamW moments (sharded 1/dp as parallel.zero says, with\n"
    "ZeRO-2/3's per-chunk buffers), a bf16 weight copy when\n"
    "GEMMs run in bf16, and activations in the compute dtype as the kernel table lays\n"
    "them out (attention's saved state included). Workspace is the BLAS threads' buffers\n"
    "(train.threads, 0 = 1). MFU = (6 * parameters + 12 * n_layer * seq_len * n_embd) *\n"
    "tokens / (step * peak * devices), the model's FLOPs counted once whatever cp is\n"
    "(--doc-len: 12 * n_layer * n_embd * the documents' pairs per sequence in place of\n"
    "seq_len^2, the FLOPs done);\n"
    "parameters: an MoE's active ones, without the embeddings that are only looked up\n"
    "(an untied input embedding, gpt2's position table). MLA (model.kv_lora_rank > 0):\n"
    "its own parameters, and attention 6 * n_layer * seq_len * n_head * (qk_nope_head_dim\n"
    "+ qk_rope_head_dim + v_head_dim); MTP (model.mtp_layers): each module's block, eh_proj\n"
    "and the LM head again, priced on the last stage.\n"
    "\n"
    "Mixture of Experts (model.moe_experts > 0; docs/CONTRACT.md \"Experts\"): each MoE block\n"
    "prices its router, its E/ep local experts (each an F/etp slice) over their balanced\n"
    "rows at each expert's own GEMM shape (x the file's moe.grouped_gemm_efficiency, x\n"
    "--moe-imbalance), the shared experts, and the all-to-all: dispatch and combine of\n"
    "rows * top_k * n_embd values each way, (ep-1)/ep of them leaving the rank, over\n"
    "NVLink to the ep group's members on the node and the network to the rest (x\n"
    "moe.a2a_efficiency); the shared experts' compute hides what it can, and an\n"
    "overlapped F/B pair (dualpipe-v) hides more under its partner's compute. etp gathers\n"
    "rows and reduce-scatters outputs. The experts reduce and shard over edp = tp * cp *\n"
    "dp / (ep * etp). The report adds the expert grid and the all-to-all's share of the\n"
    "step, hidden and exposed (--json: \"moe\": {...}); --search also tries every ep and\n"
    "etp the trainer accepts (ep dividing moe_experts, etp dividing moe_ffn_hidden, ep *\n"
    "etp dividing tp * cp * dp).\n";

bool ts_plan_has_cluster(int argc, char **argv)
{
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--cluster") || !strncmp(argv[i], "--cluster=", 10)) return true;
    return false;
}

typedef struct {
    const char *config, *cluster;
    const char *sets[256];
    int n_sets;
    bool json, search, exhaustive;
    bool no_shared_overlap;  /* --moe-no-shared-overlap */
    double imbalance;        /* --moe-imbalance (1: balanced) */
    long doc_len;            /* --doc-len (0: no packed documents) */
    long gpus, top;
    bool gpus_set, top_set;
} cluster_args;

static const ts_plan_number_opt k_gpus = {"--gpus", 1, 100000000, "devices", true};
static const ts_plan_number_opt k_top = {"--top", 1, 1000, "grids", true};
static const ts_plan_number_opt k_doc_len = {"--doc-len", 1, 1e9, "tokens", true};
static const ts_plan_number_opt k_imbalance = {"--moe-imbalance", 1, 1000,
                                               "(x the balanced share of routed rows)",
                                               false};

/* A whole-number option into a long (the ranges above are exact in a double). */
static int parse_whole(const char *v, const ts_plan_number_opt *o, long *out)
{
    double x = 0.0;
    if (ts_plan_parse_number(v, o, &x) != 0) return -1;
    *out = (long)x;
    return 0;
}

/* plan --cluster's own options (ts_plan_opt_fn); any other option but --set is refused
 * here, not passed on as plan's. */
static bool cluster_opt(void *args, int argc, char **argv, int *i, int *missing, int *rc)
{
    cluster_args *a = args;
    const char *v;
    if (!strcmp(argv[*i], "--json")) {
        a->json = true;
    } else if (!strcmp(argv[*i], "--search")) {
        a->search = true;
    } else if (!strcmp(argv[*i], "--exhaustive")) {
        a->exhaustive = true;
    } else if (!strcmp(argv[*i], "--moe-no-shared-overlap")) {
        a->no_shared_overlap = true;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--moe-imbalance", missing))) {
        *rc = ts_plan_parse_number(v, &k_imbalance, &a->imbalance);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--doc-len", missing))) {
        *rc = parse_whole(v, &k_doc_len, &a->doc_len);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--cluster", missing))) {
        a->cluster = v;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--gpus", missing))) {
        *rc = parse_whole(v, &k_gpus, &a->gpus);
        a->gpus_set = true;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--top", missing))) {
        *rc = parse_whole(v, &k_top, &a->top);
        a->top_set = true;
    } else if (!*missing && !strncmp(argv[*i], "--", 2) && strcmp(argv[*i], "--set") &&
               strncmp(argv[*i], "--set=", 6)) {
        *rc = ts_plan_usage("%s does not go with --cluster (it takes --set, --json, --gpus, "
                            "--search, --top, --exhaustive, --moe-imbalance, "
                            "--moe-no-shared-overlap, --doc-len)",
                            argv[*i]);
    } else {
        return false; /* CONFIG or --set */
    }
    return true;
}

static int parse(int argc, char **argv, cluster_args *a)
{
    memset(a, 0, sizeof *a);
    a->top = 10;
    a->imbalance = 1.0;
    if (ts_plan_parse_argv(argc, argv, cluster_opt, a, &a->config, a->sets, 256, &a->n_sets) !=
        0)
        return -1;
    if (!a->config) return ts_plan_usage("%s needs a CONFIG file", "plan --cluster");
    if (a->search && !a->gpus_set) return ts_plan_usage("%s needs --gpus N", "--search");
    if (!a->search && (a->gpus_set || a->top_set || a->exhaustive))
        return ts_plan_usage("%s", "--gpus, --top and --exhaustive go with --search");
    return 0;
}

/* ------------------------------------------------------------------ output -- */

static const char *link_name(const ts_cluster *cl, ts_link l)
{
    return l.bandwidth == cl->intra.bandwidth && l.latency == cl->intra.latency ? "intra-node"
                                                                                 : "inter-node";
}

static json_t *result_json(ts_plan_ctx *x, const ts_plan_result *r)
{
    const ts_plan_grid *g = &r->g;
    const ts_rank_memory *mm = &r->mem;
    const int *sizes = ts_plan_partition(x, g);
    json_t *part = json_array();
    for (int c = 0; sizes && c < g->pp * g->v; c++) json_array_append_new(part, json_integer(sizes[c]));
    json_t *o = json_object();
    json_object_set_new(
        o, "world", json_integer((json_int_t)g->pp * g->dp * ts_plan_grid_cp(g) * g->tp));
    json_object_set_new(o, "pp", json_integer(g->pp));
    json_object_set_new(o, "dp", json_integer(g->dp));
    json_object_set_new(o, "tp", json_integer(g->tp));
    json_object_set_new(o, "cp", json_integer(ts_plan_grid_cp(g)));
    json_object_set_new(o, "ep", json_integer(ts_plan_grid_ep(g)));
    json_object_set_new(o, "etp", json_integer(ts_plan_grid_etp(g)));
    json_object_set_new(o, "v", json_integer(g->v));
    json_object_set_new(o, "schedule", json_string(ts_plan_schedule_name(x, g->schedule)));
    json_object_set_new(o, "micro_batch", json_integer(g->micro_batch));
    json_object_set_new(o, "microbatches", json_integer(g->m));
    json_object_set_new(o, "recompute", json_string(ts_recompute_names[g->recompute]));
    json_object_set_new(o, "zero", json_integer(g->zero));
    json_object_set_new(o, "sequence_parallel", json_boolean(g->sp));
    json_object_set_new(o, "tp_overlap", json_integer(g->sub > 1 ? g->sub : 1));
    json_object_set_new(o, "partition", part);
    json_object_set_new(o, "step_ms", json_real(r->step_ms));
    json_object_set_new(o, "bubble", json_real(r->bubble));
    json_object_set_new(o, "tokens_per_s", json_real(r->tokens_per_s));
    json_object_set_new(o, "mfu", json_real(r->mfu));
    json_object_set_new(o, "fits", json_boolean(r->fits));
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)llround(mm->total)));
    json_object_set_new(o, "memory_rank", json_integer(r->mem_rank));
    json_object_set_new(
        o, "memory",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "parameters",
                  (json_int_t)llround(mm->params), "gradients", (json_int_t)llround(mm->grads),
                  "optimizer", (json_int_t)llround(mm->optimizer), "activations",
                  (json_int_t)llround(mm->activations), "activation_sets",
                  (json_int_t)llround(mm->act_sets), "buffers", (json_int_t)llround(mm->buffers),
                  "workspace", (json_int_t)llround(mm->blas)));
    const ts_plan_terms *t = &r->terms;
    json_object_set_new(o, "terms_ms",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                                  "compute", t->compute, "recompute", t->recompute, "tp_comm",
                                  t->tp_comm, "cp_comm", t->cp_comm, "optimizer", t->optimizer, "bubble", t->bubble, "dp_exposed",
                                  t->dp_exposed, "dp_reduction", t->dp_reduction, "pp_message",
                                  t->pp_comm, "dp_gather", t->dp_gather, "gather_exposed",
                                  t->gather_exposed));
    if (ts_config_muon(&ts_plan_ctx_config(x)->train)) {
        /* Muon's part of the optimizer term (plan/muon_cost.h) */
        json_t *terms = json_object_get(o, "terms_ms");
        json_object_set_new(terms, "muon_ns", json_real(t->muon_ns));
        json_object_set_new(terms, "muon_gather", json_real(t->muon_gather));
        json_object_set_new(o, "muon_ns_flops", json_real(t->muon_ns_flops));
    }
    if (ts_plan_ctx_config(x)->model.moe_experts > 0) {
        const double share = r->step_ms > 0 ? 1.0 / r->step_ms : 0.0;
        json_t *moe = json_object();
        json_object_set_new(moe, "edp", json_integer(ts_plan_grid_edp(g)));
        json_object_set_new(moe, "rows_per_expert", json_real(t->rows_per_expert));
        json_object_set_new(moe, "a2a_bytes", json_real(t->a2a_bytes));
        json_object_set_new(moe, "router_ms", json_real(t->router));
        json_object_set_new(moe, "experts_ms", json_real(t->experts));
        json_object_set_new(moe, "shared_ms", json_real(t->shared));
        json_object_set_new(moe, "a2a_ms", json_real(t->a2a));
        json_object_set_new(moe, "a2a_hidden_ms", json_real(t->a2a_hidden));
        json_object_set_new(moe, "a2a_exposed_ms", json_real(t->a2a_exposed));
        json_object_set_new(moe, "etp_ms", json_real(t->etp_comm));
        json_object_set_new(moe, "a2a_share", json_real(t->a2a * share));
        json_object_set_new(moe, "a2a_hidden_share", json_real(t->a2a_hidden * share));
        json_object_set_new(moe, "a2a_exposed_share", json_real(t->a2a_exposed * share));
        json_object_set_new(moe, "a2a_hidden_fraction",
                            json_real(t->a2a > 0 ? t->a2a_hidden / t->a2a : 0.0));
        json_object_set_new(o, "moe", moe);
    }
    json_object_set_new(json_object_get(o, "memory"), "chunk_buffers",
                        json_integer((json_int_t)llround(mm->chunk_buffers)));
    if (ts_plan_grad_ranks(g) > 1) {
        json_t *z = json_array();
        for (int q = 0; q < g->pp; q++) json_array_append_new(z, ts_plan_cli_zero_json(x, g, q));
        json_object_set_new(o, "zero_traffic", z);
    }
    return o;
}

static const char *gb(double bytes, char *buf, size_t n)
{
    snprintf(buf, n, "%.2f GB", bytes / 1e9);
    return buf;
}

/* What each chunk of a predicted grid recomputes: [{"chunk", "recomputed" (micro-batches),
 * "keep" (recompute = "auto"'s cap), "selective" (auto: the chunk laid out selective)}],
 * or, with text, one line for auto. */
static json_t *recompute_json(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const int n = g->pp * g->v;
    int *keep = ts_calloc((size_t)n, sizeof(int)), *nr = ts_calloc((size_t)n, sizeof(int));
    bool *sel = ts_calloc((size_t)n, sizeof(bool));
    ts_plan_recompute_of(x, g, keep, sel, nr);
    json_t *a = json_array();
    for (int c = 0; c < n; c++) {
        json_t *o = json_pack("{s:i, s:i}", "chunk", c, "recomputed", nr[c]);
        if (g->recompute == TS_RECOMPUTE_AUTO) {
            json_object_set_new(o, "keep", json_integer(keep[c]));
            json_object_set_new(o, "selective", json_boolean(sel[c]));
        }
        json_array_append_new(a, o);
    }
    free(keep);
    free(sel);
    free(nr);
    return a;
}

static void print_recompute(ts_plan_ctx *x, const ts_plan_grid *g)
{
    if (g->recompute != TS_RECOMPUTE_AUTO) return;
    const int n = g->pp * g->v;
    int *keep = ts_calloc((size_t)n, sizeof(int)), *nr = ts_calloc((size_t)n, sizeof(int));
    bool *sel = ts_calloc((size_t)n, sizeof(bool));
    ts_plan_recompute_of(x, g, keep, sel, nr);
    printf("recompute auto (fitted into the device's memory, or parallel.memory_budget_mb "
           "when smaller): ");
    for (int c = 0; c < n; c++)
        printf("%schunk %d keeps %d%s, recomputes %d of %d", c ? "; " : "", c, keep[c],
               sel[c] ? ", selective" : "", nr[c], g->m);
    printf("\n");
    free(keep);
    free(sel);
    free(nr);
}

/* An MoE model's expert grid and terms (moe_cost.h): the all-to-all's share of the step,
 * hidden and exposed. */
static void print_moe(ts_plan_ctx *x, const ts_plan_result *r)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    const ts_model_config *mc = &cfg->model;
    if (mc->moe_experts <= 0) return;
    const ts_plan_grid *g = &r->g;
    const ts_plan_terms *t = &r->terms;
    const int ep = ts_plan_grid_ep(g), etp = ts_plan_grid_etp(g);
    const int in = ts_plan_ep_node_members(cl, g);
    printf("experts: ep %d x etp %d x edp %d; %d of %d experts per rank (top %d, %d shared), "
           "each %d of %d columns; %.1f rows per expert per micro-batch (balanced); "
           "all-to-all %s (%d of the ep group on a node), %.3f MB per exchange leaving a "
           "rank; etp %s\n",
           ep, etp, ts_plan_grid_edp(g), mc->moe_experts / ep, mc->moe_experts,
           mc->moe_top_k, mc->moe_shared_experts, mc->moe_ffn_hidden / etp, mc->moe_ffn_hidden,
           t->rows_per_expert, ep == 1 ? "none" : in == ep ? "intra-node" : "inter-node", in,
           t->a2a_bytes / 1e6, etp == 1 ? "none" : link_name(cl, ts_plan_etp_link(cl, g)));
    if (strcmp(cfg->train.device, "cuda") == 0)
        printf("note: a GPU run planned: tessera train runs the Mixture of Experts on the CPU "
               "only so far (train.device = \"cuda\" with model.moe_experts is refused there)\n");
    const double pct = r->step_ms > 0 ? 100.0 / r->step_ms : 0.0;
    printf("moe (busiest rank, ms per step): router %.3f, routed experts %.3f, shared "
           "experts %.3f (GEMMs, in compute); etp gathers %.3f; all-to-all %.3f = %.1f%% "
           "of the step: hidden %.3f (%.1f%%), exposed %.3f (%.1f%%)\n",
           t->router, t->experts, t->shared, t->etp_comm, t->a2a, t->a2a * pct, t->a2a_hidden,
           t->a2a_hidden * pct, t->a2a_exposed, t->a2a_exposed * pct);
}

static void print_prediction(ts_plan_ctx *x, const cluster_args *a, const ts_plan_result *r)
{
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    const ts_config *cfg = ts_plan_ctx_config(x);
    const ts_plan_grid *g = &r->g;
    const int cp = ts_plan_grid_cp(g);
    const long long world = (long long)g->pp * g->dp * cp * g->tp;
    char b[7][32];
    char overlap[64] = "";
    if (g->sub > 1 && g->tp > 1 && g->micro_batch % g->sub == 0)
        snprintf(overlap, sizeof overlap, "; tp_overlap %d (sub-batches of %d)", g->sub,
                 g->micro_batch / g->sub);
    printf("tessera plan: %s on %s (%s)\n", a->config, cl->name, a->cluster);
    char ctx[160] = "";
    if (cp > 1)
        snprintf(ctx, sizeof ctx,
                 "; cp %d (context parallel: each sequence in %d chunks of %d, %d positions "
                 "per rank)",
                 cp, 2 * cp, cfg->model.seq_len / (2 * cp), cfg->model.seq_len / cp);
    printf("grid: world %lld = pp %d x dp %d x cp %d x tp %d (%lld node%s of %d); schedule %s, "
           "virtual stages %d, %d micro-batches of %d x %d tokens; recompute %s; zero %d%s%s%s\n",
           world, g->pp, g->dp, cp, g->tp,
           (world + cl->devices_per_node - 1) / cl->devices_per_node,
           world > cl->devices_per_node ? "s" : "", cl->devices_per_node,
           ts_plan_schedule_name(x, g->schedule), g->v, g->m, g->micro_batch,
           cfg->model.seq_len, ts_recompute_names[g->recompute], g->zero,
           g->sp ? "; sp (sequence parallel: norms, residuals and messages in seq_len / tp rows)"
                 : "",
           ctx, overlap);
    printf("links: tp %s, cp %s, dp %s, pp %s; GEMMs in %s (peak %.1f TFLOP/s per device)\n",
           link_name(cl, ts_plan_tp_link(cl, g)), link_name(cl, ts_plan_cp_link(cl, g)),
           link_name(cl, ts_plan_dp_link(cl, g)), link_name(cl, ts_plan_pp_link(cl, g)),
           cl->bf16 ? "bf16" : "fp32", ts_cluster_peak(cl) * 1e-12);
    const int *sizes = ts_plan_partition(x, g);
    printf("partition: layers per chunk");
    for (int c = 0; sizes && c < g->pp * g->v; c++) printf(" %d", sizes[c]);
    printf("\n");
    const ts_rank_memory *m = &r->mem;
    char cb[64] = "";
    if (m->chunk_buffers > 0)
        snprintf(cb, sizeof cb, ", chunk buffers %.2f GB", m->chunk_buffers / 1e9);
    printf("memory per device: %s on pipeline rank %d (%s): parameters %s, gradients %s, "
           "optimizer state %s%s, activations %s, buffers %s, workspace %s\n",
           gb(m->total, b[0], 32), r->mem_rank,
           r->fits ? "fits" : "DOES NOT FIT", gb(m->params, b[1], 32), gb(m->grads, b[2], 32),
           gb(m->optimizer, b[3], 32), cb, gb(m->activations, b[4], 32), gb(m->buffers, b[5], 32),
           gb(m->blas, b[6], 32));
    /* Only the remedies this grid has not taken yet (new user: the hint suggested ZeRO-1
     * and micro-batch 1 to a config that had both). */
    char hint[192] = "";
    if (!r->fits) {
        size_t n = 0;
        if (g->micro_batch > 1)
            n += (size_t)snprintf(hint + n, sizeof hint - n, "lower micro_batch, ");
        if (g->recompute != TS_RECOMPUTE_FULL && g->recompute != TS_RECOMPUTE_AUTO)
            n += (size_t)snprintf(hint + n, sizeof hint - n, "recompute = \"full\", ");
        if (g->zero < 3 && ts_plan_grad_ranks(g) > 1)
            n += (size_t)snprintf(hint + n, sizeof hint - n, "zero = %d, ", g->zero + 1);
        if (!g->sp && g->tp > 1 && cfg->model.seq_len % g->tp == 0)
            n += (size_t)snprintf(hint + n, sizeof hint - n, "sequence_parallel = true, ");
        snprintf(hint + n, sizeof hint - n, "raise pp or tp (more devices per replica)");
    }
    printf("  device memory %.2f GB%s%s\n", cl->memory / 1e9, r->fits ? "" : ": ", hint);
    print_recompute(x, g);
    const ts_plan_terms *t = &r->terms;
    char cpc[96] = "";
    if (cp > 1)
        snprintf(cpc, sizeof cpc, ", cp K/V all-gathers and reduce-scatters %.3f", t->cp_comm);
    printf("step: %.3f ms; busiest rank: compute %.3f, recompute %.3f, tp %s %.3f%s, "
           "optimizer %.3f; idle in the bubble %.3f; dp reduction %.3f ms (%.3f exposed)\n",
           r->step_ms, t->compute, t->recompute,
           g->sp ? "all-gathers and reduce-scatters" : "all-reduces", t->tp_comm, cpc,
           t->optimizer, t->bubble, t->dp_reduction, t->dp_exposed);
    if (g->zero == 3 && ts_plan_grad_ranks(g) > 1)
        printf("zero 3 weight gathers: %.3f ms on the busiest rank's link, %.3f ms exposed\n",
               t->dp_gather, t->gather_exposed);
    if (ts_config_muon(&cfg->train))
        printf("muon: Newton-Schulz %.4g GFLOP per step on the busiest owner of %d (%.3f ms), "
               "tp gathers %.3f ms, of the optimizer's %.3f ms\n",
               t->muon_ns_flops / 1e9, ts_plan_grad_ranks(g), t->muon_ns, t->muon_gather,
               t->optimizer);
    ts_plan_cli_print_zero(x, g);
    print_moe(x, r);
    printf("bubble: %.4f; tokens/s: %.4g; MFU: %.1f%%\n", r->bubble, r->tokens_per_s,
           100.0 * r->mfu);
}

static void print_row(ts_plan_ctx *x, int k, const ts_plan_result *r)
{
    const ts_plan_grid *g = &r->g;
    if (ts_plan_ctx_config(x)->model.moe_experts > 0)
        printf("%4d  %6d %6d", k, ts_plan_grid_ep(g), ts_plan_grid_etp(g));
    else
        printf("%4d", k);
    printf("  %4d %5d %3d %3d  %-16s %3d %4d %-4s %4d %3s  %9.2f  %11.3f  %11.4g  %5.1f%%  "
           "%6.4f\n",
           g->pp, g->dp, g->tp, ts_plan_grid_cp(g), ts_plan_schedule_name(x, g->schedule),
           g->v, g->micro_batch,
           ts_recompute_names[g->recompute], g->zero, g->sp ? "on" : "off", r->mem.total / 1e9,
           r->step_ms, r->tokens_per_s, 100.0 * r->mfu, r->bubble);
}

/* The best grid as the config's parallel keys (what to set to run it). */
static void print_best_config(ts_plan_ctx *x, const ts_plan_grid *g)
{
    printf("best as config (the parallel section, or --set parallel.KEY=VALUE):\n");
    printf("  parallel.pp = %d\n  parallel.dp = %d\n  parallel.tp = %d\n  parallel.cp = %d\n",
           g->pp, g->dp, g->tp, ts_plan_grid_cp(g));
    printf("  parallel.schedule = \"%s\"\n  parallel.virtual_stages = %d\n",
           ts_plan_schedule_name(x, g->schedule), g->v);
    printf("  parallel.micro_batch = %d\n  parallel.recompute = \"%s\"\n  parallel.zero = %d\n",
           g->micro_batch, ts_recompute_names[g->recompute], g->zero);
    printf("  parallel.sequence_parallel = %s\n", g->sp ? "true" : "false");
    if (ts_plan_ctx_config(x)->model.moe_experts > 0)
        printf("  parallel.ep = %d\n  parallel.etp = %d\n", ts_plan_grid_ep(g),
               ts_plan_grid_etp(g));
}

static void print_search(ts_plan_ctx *x, const cluster_args *a, const ts_search_result *s,
                         double seconds)
{
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    printf("tessera plan: %s on %ld devices of %s (%s)\n", a->config, a->gpus, cl->name,
           a->cluster);
    printf("searched %d grids (pp x dp x cp x tp), %lld candidates with schedule, v, "
           "micro_batch, recompute, zero, sequence parallelism%s: %lld fit in %.2f GB, %lld "
           "simulated, %.2f s\n",
           s->n_grids, s->candidates,
           ts_plan_ctx_config(x)->model.moe_experts > 0 ? ", ep, etp" : "", s->fit, cl->memory / 1e9, s->simulated, seconds);
    if (ts_plan_ctx_config(x)->model.moe_experts > 0)
        printf("%4s  %6s %6s", "rank", "ep", "etp");
    else
        printf("%4s", "rank");
    printf("  %4s %5s %3s %3s  %-16s %3s %4s %-4s %4s %3s  %9s  %11s  %11s  %6s  %6s\n",
           "pp", "dp", "tp", "cp", "schedule", "v", "mb", "rc", "zero", "sp", "mem_GB",
           "step_ms", "tokens/s", "MFU", "bubble");
    for (int k = 0; k < s->n_top; k++) print_row(x, k + 1, &s->top[k]);
    if (s->n_top > 0) print_best_config(x, &s->top[0].g);
    printf("the rest:\n");
    if (s->oom) {
        char over[32];
        gb(s->oom_closest.mem.total - cl->memory, over, sizeof over);
        printf("  out of memory: %lld (the closest over by %s)\n", s->oom, over);
    }
    for (int k = 0; k < TS_N_LOSSES; k++)
        if (s->lost[k])
            printf("  slower, mostly by %s: %lld\n", ts_loss_names[k], s->lost[k]);
    if (s->unestimated)
        printf("  slower by their bound, recompute auto (caps not fitted): %lld\n",
               s->unestimated);
    if (s->bound_cp)
        printf("  %s shapes (grid, micro_batch%s) slower by their work floor, not "
               "estimated: %lld\n",
               ts_plan_ctx_config(x)->model.moe_experts > 0 ? "context-parallel and expert-grid"
                                                           : "context-parallel",
               ts_plan_ctx_config(x)->model.moe_experts > 0 ? ", ep, etp" : "", s->bound_cp);
    if (!s->oom && s->fit == s->n_top && !s->bound_cp) printf("  none\n");
}

static json_t *search_json(ts_plan_ctx *x, const cluster_args *a, const ts_search_result *s,
                           double seconds)
{
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    json_t *o = json_object(), *top = json_array(), *rej = json_object();
    json_object_set_new(o, "gpus", json_integer(a->gpus));
    json_object_set_new(o, "cluster", json_string(cl->name));
    json_object_set_new(o, "grids", json_integer(s->n_grids));
    json_object_set_new(o, "candidates", json_integer(s->candidates));
    json_object_set_new(o, "fit", json_integer(s->fit));
    json_object_set_new(o, "simulated", json_integer(s->simulated));
    json_object_set_new(o, "seconds", json_real(seconds));
    json_object_set_new(o, "best", result_json(x, &s->top[0]));
    for (int k = 0; k < s->n_top; k++) json_array_append_new(top, result_json(x, &s->top[k]));
    json_object_set_new(o, "top", top);
    json_object_set_new(
        rej, "out_of_memory",
        json_pack("{s:I, s:I}", "count", (json_int_t)s->oom, "min_over_bytes",
                  (json_int_t)(s->oom ? llround(s->oom_closest.mem.total - cl->memory) : 0)));
    for (int k = 0; k < TS_N_LOSSES; k++)
        json_object_set_new(rej, ts_loss_names[k], json_integer(s->lost[k]));
    json_object_set_new(rej, "bound_auto", json_integer(s->unestimated));
    json_object_set_new(rej, "bound_cp", json_integer(s->bound_cp));
    json_object_set_new(o, "rejected", rej);
    return o;
}

int ts_cmd_plan_cluster(int argc, char **argv)
{
    cluster_args a;
    if (parse(argc, argv, &a) != 0) return 2;
    ts_cluster cl;
    if (ts_cluster_load(a.cluster, &cl) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    ts_config cfg;
    if (ts_config_load_plan(&cfg, a.config, a.sets, a.n_sets) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    if (ts_cluster_use_precision(&cl, a.cluster, cfg.train.precision) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    if (cfg.model.moe_experts <= 0 && (a.imbalance != 1.0 || a.no_shared_overlap)) {
        ts_log_error("--moe-imbalance and --moe-no-shared-overlap describe a Mixture of Experts: "
                     "%s is a dense model (model.moe_experts = 0)",
                     a.config);
        return 1;
    }
    if (a.doc_len > 0 && !cfg.data.document_mask) {
        ts_log_error("--doc-len plans packed documents: %s trains without them (set "
                     "data.document_mask = true)",
                     a.config);
        return 1;
    }
    /* A run with document masks and no --doc-len: one document per window, the pairs a
     * causal window computes (the trainer's MFU counts the same). */
    if (cfg.data.document_mask && a.doc_len == 0) a.doc_len = cfg.model.seq_len;
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    ts_plan_ctx_set_moe(x, a.imbalance, !a.no_shared_overlap);
    ts_plan_ctx_set_documents(x, (int)a.doc_len);
    int code = 0;
    if (!a.search) {
        ts_plan_grid g;
        ts_plan_grid_of(&cfg, &g);
        ts_plan_result r;
        if (ts_plan_predict(x, &g, &r, NULL) != TS_OK) {
            ts_log_error("%s", ts_error_message());
            code = 1;
        } else if (a.json) {
            json_t *o = result_json(x, &r), *ranks = json_array();
            json_object_set_new(o, "cluster", json_string(cl.name));
            for (int q = 0; q < g.pp; q++) {
                ts_rank_memory m;
                ts_plan_rank_memory_of(x, &g, q, &m);
                json_array_append_new(
                    ranks, json_pack("{s:i, s:I, s:I, s:I, s:I}", "pp_rank", q, "memory_bytes",
                                     (json_int_t)llround(m.total), "optimizer",
                                     (json_int_t)llround(m.optimizer), "activation_sets",
                                     (json_int_t)llround(m.act_sets), "activations",
                                     (json_int_t)llround(m.activations)));
            }
            json_object_set_new(o, "ranks", ranks);
            json_object_set_new(o, "recompute_chunks", recompute_json(x, &g));
            code = ts_plan_print_json(o);
        } else {
            print_prediction(x, &a, &r);
        }
    } else {
        const double t0 = ts_now_ms();
        ts_search_opts o = {.gpus = (int)a.gpus, .top = (int)a.top, .exhaustive = a.exhaustive};
        ts_search_result s;
        if (ts_plan_search(x, &o, &s) != TS_OK) {
            ts_log_error("%s", ts_error_message());
            code = 1;
        } else {
            const double secs = (ts_now_ms() - t0) * 1e-3;
            if (a.json)
                code = ts_plan_print_json(search_json(x, &a, &s, secs));
            else
                print_search(x, &a, &s, secs);
        }
        ts_search_result_free(&s);
    }
    ts_plan_ctx_free(x);
    return code;
}
