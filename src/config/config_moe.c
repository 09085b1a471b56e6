/* The Mixture-of-Experts keys' rules (docs/CONTRACT.md "Model" and "Config"): model.moe_*,
 * model.qk_norm, train.moe_* and parallel.ep/etp, checked against each other and against
 * the rest of the config after ts_config_validate's own checks. A key whose feature is not
 * built (expert parallelism; MoE on a grid or with a feature the MoE layer does not run
 * with yet) is an error saying so, never accepted and ignored. Nothing here prints. */
#include "config/config_internal.h"

#include <stdio.h>
#include <string.h>

static const char *const MOE_ROUTERS[] = { "softmax", "sigmoid" };

ts_status ts_config_check_moe_router(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    for (int i = 0; i < 2; i++)
        if (strcmp(v, MOE_ROUTERS[i]) == 0) return TS_OK;
    return ts_fail("config key 'model.moe_router' = \"%s\"%s is not a router; choose "
                   "\"softmax\" (Mixtral, Qwen3-MoE: softmax over the experts' logits) or "
                   "\"sigmoid\" (DeepSeek-V3: a sigmoid per expert)",
                   v, where);
}

/* A dense model (moe_experts = 0) takes no other MoE key: the first one set to other than
 * its default, by name, or NULL. */
static const char *dense_key_set(const ts_config *cfg)
{
    ts_config d;
    ts_config_defaults(&d);
    const ts_model_config *m = &cfg->model, *dm = &d.model;
    if (m->moe_top_k != dm->moe_top_k) return "model.moe_top_k";
    if (m->moe_ffn_hidden != dm->moe_ffn_hidden) return "model.moe_ffn_hidden";
    if (m->moe_shared_experts != dm->moe_shared_experts) return "model.moe_shared_experts";
    if (strcmp(m->moe_router, dm->moe_router) != 0) return "model.moe_router";
    if (m->moe_norm_topk != dm->moe_norm_topk) return "model.moe_norm_topk";
    if (m->moe_route_scale != dm->moe_route_scale) return "model.moe_route_scale";
    if (m->moe_groups != dm->moe_groups) return "model.moe_groups";
    if (m->moe_topk_groups != dm->moe_topk_groups) return "model.moe_topk_groups";
    if (m->moe_first_dense != dm->moe_first_dense) return "model.moe_first_dense";
    if (m->moe_every != dm->moe_every) return "model.moe_every";
    if (m->moe_capacity != dm->moe_capacity) return "model.moe_capacity";
    if (cfg->train.moe_aux_loss != 0.0) return "train.moe_aux_loss";
    if (cfg->train.moe_z_loss != 0.0) return "train.moe_z_loss";
    if (cfg->train.moe_bias_rate != 0.0) return "train.moe_bias_rate";
    if (cfg->parallel.ep != 1) return "parallel.ep";
    if (cfg->parallel.etp != 1) return "parallel.etp";
    if (cfg->parallel.ep_overlap != d.parallel.ep_overlap) return "parallel.ep_overlap";
    if (cfg->log.moe_every != 0) return "log.moe_every";
    if (m->init_upcycle) return "model.init_upcycle";
    return NULL;
}

/* The routing's shape: top-k of E, in groups. */
static ts_status check_routing(const ts_model_config *m)
{
    const int E = m->moe_experts, K = m->moe_top_k, G = m->moe_groups, TG = m->moe_topk_groups;
    if (m->moe_ffn_hidden < 1)
        return ts_fail("model.moe_experts = %d needs model.moe_ffn_hidden >= 1 (each expert's "
                       "SwiGLU width; Mixtral's intermediate_size, Qwen3-MoE's "
                       "moe_intermediate_size)",
                       E);
    if ((long long)m->moe_shared_experts * m->moe_ffn_hidden > (1LL << 24))
        return ts_fail("model.moe_shared_experts * model.moe_ffn_hidden = %d * %d: the shared "
                       "experts' width must be at most 2^24",
                       m->moe_shared_experts, m->moe_ffn_hidden);
    /* The routing kernels' limit (kernels.h ts_moe_routing: 1024 on the CPU; CUDA's
     * 256, with K and groups <= 64, is moot while MoE refuses cuda). */
    if (E > 1024)
        return ts_fail("model.moe_experts = %d: at most 1024 experts are supported (the "
                       "routing kernels' limit)",
                       E);
    if (K < 1 || K > E)
        return ts_fail("model.moe_top_k = %d must be between 1 and model.moe_experts = %d "
                       "(each token goes to top_k distinct experts)",
                       K, E);
    if (E % G != 0)
        return ts_fail("model.moe_experts = %d must divide by model.moe_groups = %d (the "
                       "group-limited selection splits the experts into equal groups)",
                       E, G);
    if (TG > G)
        return ts_fail("model.moe_topk_groups = %d is more than model.moe_groups = %d (the "
                       "groups a token's experts may come from, of the groups there are)",
                       TG, G);
    if (K % TG != 0)
        return ts_fail("model.moe_top_k = %d must divide by model.moe_topk_groups = %d "
                       "(DeepSeek-V3's rule: a group is scored by the sum of its top "
                       "top_k/topk_groups scores; 8 and 4 there)",
                       K, TG);
    if (K / TG > E / G)
        return ts_fail("model.moe_top_k / model.moe_topk_groups = %d / %d = %d experts per "
                       "group are more than the model.moe_experts / model.moe_groups = %d / "
                       "%d = %d experts a group has",
                       K, TG, K / TG, E, G, E / G);
    int n_moe = 0;
    for (int l = 0; l < m->n_layer; l++) n_moe += ts_model_block_is_moe(m, l);
    if (n_moe == 0)
        return ts_fail("model.moe_experts = %d, but no block is an MoE block: block l (from 0) "
                       "is one when l >= model.moe_first_dense = %d and (l + 1) %% "
                       "model.moe_every = %d == 0, of model.n_layer = %d blocks; lower "
                       "moe_first_dense or moe_every, or set moe_experts = 0",
                       E, m->moe_first_dense, m->moe_every, m->n_layer);
    return TS_OK;
}

/* Expert parallelism: the Hostile rules first (so the message names the keys that do not
 * fit), then what is built: ep and etp over any of a stage's tp, cp and dp ranks
 * (topology/expert_grid.h's fold), any pp, schedule, recompute and ZeRO level, with
 * checkpoints and model.init (each expert, or each etp slice of it, owned by its edp
 * group): model/moe.c's exchange (under tp each tp rank sends its share of the
 * replicated rows, under sp its own rows), the reducer's edp groups, which ZeRO shards by
 * bucket, the norm's count. */
static ts_status check_expert_grid(const ts_config *cfg)
{
    const ts_parallel_config *p = &cfg->parallel;
    const int E = cfg->model.moe_experts;
    if (p->ep == 1 && p->etp == 1) return TS_OK;
    if (E % p->ep != 0)
        return ts_fail("model.moe_experts = %d must divide by parallel.ep = %d (each "
                       "expert-parallel rank holds moe_experts/ep experts)",
                       E, p->ep);
    long long ranks = (long long)p->tp * p->cp * p->dp;
    if (ranks % ((long long)p->ep * p->etp) != 0)
        return ts_fail("parallel.ep * parallel.etp = %d * %d must divide parallel.tp * "
                       "parallel.cp * parallel.dp = %d * %d * %d = %lld (the expert grid folds "
                       "onto those ranks)",
                       p->ep, p->etp, p->tp, p->cp, p->dp, ranks);
    /* Expert tensor parallelism (tensor/expert_tp.h) is built over any of a stage's tp,
     * cp and dp ranks, with or without ep, any pp: each rank an F/etp slice of its
     * experts, gathering its rows from the etp group (under tp without sp each tp rank
     * brings its share of the replicated rows, under sp its own: model/moe.c). */
    if (p->etp > 1 && cfg->model.moe_ffn_hidden % p->etp != 0)
        return ts_fail("model.moe_ffn_hidden = %d must divide by parallel.etp = %d (each "
                       "etp rank holds moe_ffn_hidden/etp of every expert's width)",
                       cfg->model.moe_ffn_hidden, p->etp);
    /* parallel.ep_overlap (either value on any MoE grid; a dense model refuses it off,
     * as every MoE key, dense_key_set): with ep > 1 it chooses the non-blocking exchange
     * or the blocking one (the same numbers); with ep 1 there is no exchange and it has
     * nothing to change, as overlap_grad_sync with dp 1, so one config runs on every ep.
     * Megatron's --overlap-moe-expert-parallel-comm is off by default and asserts ep > 1;
     * this one is on by default. */
    /* Checkpoints and model.init: each expert is stored whole under its global id,
     * written by its own edp group (under etp each slice by its own) and read by the
     * ranks holding it, each its slice (checkpoint.h). */
    return TS_OK;
}

/* model.init_upcycle (checkpoint/upcycle.h): the MoE starts from a dense Llama's weights,
 * each routed expert a copy of its MLP, so that the first loss is the dense model's. That
 * holds when each expert is the dense MLP whole (Megatron's upcycling at granularity 1:
 * the widths equal), each token's routing weights sum to one (the combine then sums k
 * equal outputs times weights summing to one) and nothing is added beside them (no shared
 * expert). The rest is refused, naming the key: Megatron's granular upcycling (an expert a
 * 1/g slice of the dense MLP, scaled) and its scaling for weights that do not sum to one
 * are not built. */
static ts_status check_upcycle(const ts_model_config *m)
{
    if (!m->init_upcycle) return TS_OK;
    if (!m->init[0])
        return ts_fail("model.init_upcycle = true needs model.init: the dense Llama's weights "
                       "(a save_pretrained or step directory, or a safetensors file) whose "
                       "MLPs the experts are copied from");
    if (m->moe_ffn_hidden != ts_model_ffn(m))
        return ts_fail("model.init_upcycle = true with model.moe_ffn_hidden = %d, but "
                       "model.ffn_hidden = %d (the dense MLP's width: config.json's "
                       "intermediate_size): each expert is a whole copy of the dense MLP, so "
                       "the widths must be equal (granular upcycling, an expert a slice of "
                       "the dense MLP, is not built)",
                       m->moe_ffn_hidden, ts_model_ffn(m));
    if (m->moe_shared_experts > 0)
        return ts_fail("model.init_upcycle = true with model.moe_shared_experts = %d: the "
                       "routed experts' combine already gives the dense MLP's output, and a "
                       "shared expert would add a second term to it; set "
                       "model.moe_shared_experts = 0",
                       m->moe_shared_experts);
    if (m->moe_route_scale != 1.0)
        return ts_fail("model.init_upcycle = true with model.moe_route_scale = %g: the "
                       "routing weights would sum to %g, not one, and scale the dense MLP's "
                       "output; set model.moe_route_scale = 1",
                       m->moe_route_scale, m->moe_route_scale);
    const bool sigmoid = strcmp(m->moe_router, "sigmoid") == 0;
    if (!m->moe_norm_topk && (sigmoid || m->moe_top_k < m->moe_experts))
        return ts_fail("model.init_upcycle = true with model.moe_norm_topk = false: the "
                       "routing weights (%s scores of the top %d of %d experts) do not sum to "
                       "one, so the experts' combine would scale the dense MLP's output; set "
                       "model.moe_norm_topk = true",
                       sigmoid ? "sigmoid" : "softmax", m->moe_top_k, m->moe_experts);
    return TS_OK;
}

/* What the MoE layer does not run with yet: an error saying so, not wrong numbers. Built
 * (model/moe.c): one tensor- and context-parallel rank, with data parallelism (every
 * ZeRO level: the experts are ordinary parameters), pipeline parallelism with every
 * schedule (the zero-bubble ones: the MoE's weight gradients are made in the input pass)
 * and virtual stages, every recompute mode (the step's counts are the backward's), whose
 * losses tests/test_moe_grids.sh holds to one rank's, and context parallelism (every
 * term but the balance loss is per token; that one sums each sequence's counts over the
 * ranks holding its positions: moe.c balance_split), and tensor parallelism (without ep
 * or etp the MoE replicated on the tp ranks; with them each tp rank sends its share of
 * the rows), and sequence parallelism (each tp rank routes its own rows, nothing
 * gathered; the balance loss's counts summed as under cp), in fp32 and bf16 (the router
 * in fp32 from the widened rows). Not: tp_overlap (the MoE would take sub-batches) and
 * CUDA (never run). */
static ts_status check_moe_built(const ts_config *cfg)
{
    const ts_parallel_config *p = &cfg->parallel;
    const int E = cfg->model.moe_experts;
    const struct {
        bool unbuilt;
        const char *what;
    } axes[] = {
        {p->tp_overlap > 1, "parallel.tp_overlap > 1"},
        /* `tessera plan` sizes and times a GPU run (ts_config_planning: the CUDA kernel
         * table's layout, never run); with --cluster it notes that training it is not
         * built yet (cmd_plan_search.c print_moe). */
        {strcmp(cfg->train.device, "cuda") == 0 && !ts_config_planning(),
         "train.device = \"cuda\""},
    };
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++)
        if (axes[i].unbuilt)
            return ts_fail("model.moe_experts = %d with %s: the Mixture-of-Experts layer is "
                           "built for any tp (with or without sequence parallelism), dp, cp, "
                           "pp, ep, etp, schedule and recompute, fp32 and bf16, on the CPU so "
                           "far; that combination is not built yet",
                           E, axes[i].what);
    return TS_OK;
}

ts_status ts_config_validate_moe(const ts_config *cfg)
{
    const ts_model_config *m = &cfg->model;
    const bool gpt2 = ts_model_arch(m) == TS_ARCH_GPT2;
    if (m->qk_norm && gpt2)
        return ts_fail("model.qk_norm = true: the per-head RMSNorm of q and k (Qwen3) is a "
                       "llama-family feature; remove it or set model.arch = \"llama\"");
    if (m->moe_experts == 0) {
        const char *key = dense_key_set(cfg);
        if (key)
            return ts_fail("%s is set, but model.moe_experts = 0 (a dense model has no "
                           "experts); set model.moe_experts or remove %s",
                           key, key);
        return TS_OK;
    }
    if (gpt2)
        return ts_fail("model.moe_experts = %d with model.arch = \"gpt2\": Mixture of Experts "
                       "is built for the llama family (SwiGLU experts); set model.arch = "
                       "\"llama\" or model.moe_experts = 0",
                       m->moe_experts);
    if (check_routing(m) != TS_OK) return TS_ERR;
    if (check_upcycle(m) != TS_OK) return TS_ERR;
    if (check_expert_grid(cfg) != TS_OK) return TS_ERR;
    return check_moe_built(cfg);
}
