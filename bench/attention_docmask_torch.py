#!/usr/bin/env python3
"""The PyTorch peer of bench/attention_docmask.sh: forward + backward of attention over one
sequence of T positions cut into documents of L (fp32, NH heads of HS, T/L documents),
median milliseconds over REPS (wall, and process CPU time), in the forms PyTorch has for it on the CPU:
  flex       flex_attention with a document BlockMask (torch.compile'd: the form that
             skips masked blocks), when it compiles here (else "-", with the reason)
  per_doc    scaled_dot_product_attention on each document alone (causal), in a loop:
             the ideal of skipping (work ~ sum L^2), no masking at all
  dense      scaled_dot_product_attention with the dense [T, T] boolean document mask
             (work ~ T^2 whatever the documents)
Usage: attention_docmask_torch.py T NH HS REPS THREADS L [L...]"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, reps):
    """Median wall ms and median process CPU ms (the work, on a shared machine)."""
    fn()  # warm-up (and compilation)
    ts, cs = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
        cs.append((time.process_time() - c0) * 1e3)
    return statistics.median(ts), statistics.median(cs)


def main():
    T, NH, HS, reps, threads = (int(a) for a in sys.argv[1:6])
    lens = [int(a) for a in sys.argv[6:]]
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, NH, T, HS, generator=g, requires_grad=True) for _ in range(3))
    do = torch.randn(1, NH, T, HS, generator=g)
    flex = None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = (torch.compile(flex_attention), create_block_mask)
    except Exception as e:  # noqa: BLE001
        flex_why = f"{type(e).__name__}: {e}"
    print(f"torch {torch.__version__}, {threads} threads, B 1 T {T} NH {NH} HS {HS} fp32, "
          f"median of {reps}")
    print(f"{'doc_len':>8} {'flex_ms':>10} {'per_doc_ms':>11} {'per_doc_cpu':>12} "
          f"{'dense_ms':>10} {'dense_cpu':>10}")
    for L in lens:
        doc = torch.arange(T) // L

        def fwd_bwd(f):
            def run():
                for t in (q, k, v):
                    t.grad = None
                f().backward(do)
            return run

        def per_doc():
            outs = [F.scaled_dot_product_attention(q[:, :, s:s + L], k[:, :, s:s + L],
                                                   v[:, :, s:s + L], is_causal=True)
                    for s in range(0, T, L)]
            return torch.cat(outs, dim=2)

        mask = (doc[:, None] == doc[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
        dense = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        f_ms = "-"
        if flex is not None:
            try:
                fa, cbm = flex

                def mask_mod(b, h, qi, ki):
                    return (doc[qi] == doc[ki]) & (qi >= ki)
                bm = cbm(mask_mod, None, None, T, T, device="cpu")
                f_ms = f"{timed(fwd_bwd(lambda: fa(q, k, v, block_mask=bm)), reps)[0]:.2f}"
            except Exception as e:  # noqa: BLE001
                flex_why = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                flex = None
        p_ms, p_cpu = timed(fwd_bwd(per_doc), reps)
        d_ms, d_cpu = timed(fwd_bwd(dense), reps)
        print(f"{L:>8} {f_ms:>10} {p_ms:>11.2f} {p_cpu:>12.2f} {d_ms:>10.2f} {d_cpu:>10.2f}")
    if flex is None:
        print(f"flex_attention not run: {flex_why}")


if __name__ == "__main__":
    main()
