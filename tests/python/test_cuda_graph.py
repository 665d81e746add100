"""test_cuda_graph.py : a decode step of flash_attn_with_kvcache captured in a CUDA graph.

Inference engines capture their decode step once and replay it for every token, with
the inputs (q, the new k and v, cache_seqlens) rewritten in place between replays. So
a captured call must do all its work on the capturing stream, allocate only through
torch (its workspace then comes from the graph's pool) and read the lengths on the
device at run time. Each case captures one step, then replays it for several tokens
and compares the output and both caches bitwise with the same call made eagerly on
copies of the caches. Needs a CUDA device (skips otherwise).

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import pytest
import torch

import flashc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def fresh(*tensors, seed):
    """Rewrite tensors in place with new random values (the next token's inputs)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float32))


@pytest.mark.parametrize("page", [0, 16], ids=["contiguous", "paged16"])
@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_decode_step_replayed(page, num_splits):
    b, h, hk, d, capacity, dt = 3, 8, 2, 128, 512, torch.bfloat16
    if page:
        blocks = capacity // page
        k_cache = torch.randn(b * blocks, page, hk, d, device="cuda", dtype=dt)
        block_table = torch.randperm(b * blocks, device="cuda", dtype=torch.int32).view(b, blocks)
    else:
        k_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dt)
        block_table = None
    v_cache = torch.randn_like(k_cache)
    cache_seqlens = torch.tensor([5, 100, 300], device="cuda", dtype=torch.int32)
    q = torch.empty(b, 1, h, d, device="cuda", dtype=dt)
    k_new, v_new = (torch.empty(b, 1, hk, d, device="cuda", dtype=dt) for _ in range(2))

    def step(kc, vc, lens):
        return flashc.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens,
                                              block_table=block_table, causal=True,
                                              num_splits=num_splits)

    # warm up on a side stream (torch's advice before capturing), on copies of the
    # caches: the call appends k_new, v_new into them
    fresh(q, k_new, v_new, seed=0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(k_cache.clone(), v_cache.clone(), cache_seqlens.clone())
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(k_cache, v_cache, cache_seqlens)  # captured, not run

    for token in range(4):
        fresh(q, k_new, v_new, seed=token + 1)
        kc, vc, lens = k_cache.clone(), v_cache.clone(), cache_seqlens.clone()
        want = step(kc, vc, lens)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), "token %d: the replayed output differs" % token
        assert torch.equal(k_cache, kc) and torch.equal(v_cache, vc), \
            "token %d: the replayed append differs" % token
        assert not torch.isnan(out).any()
        cache_seqlens += 1  # the next token: read by the graph's kernels at replay
