"""Measure Llama-2-7B-shaped step components on a real GPU, to check the GPU cost models.

Needs PyTorch with CUDA (not a fairsim dependency; run it on a GPU machine). With random bf16
weights it times, with CUDA events (median of repeated runs after warm-up), one decoder layer's
token-level work (RMS norms, QKV / output / gated-MLP projections, activation, residual adds) for
several token counts, decode attention (one query per request over its cached keys and values)
and causal prefill attention, each scaled to 32 layers. It prints one JSON object last (and
writes it to --out): `linear_ms[tokens]`, `decode_attention_ms["batch,context"]`,
`prefill_attention_ms[tokens]`, plus the device name. `tests/data/h100_llama2_7b_timings.json`
holds one such measurement, which tests compare the roofline and Vidur-profile models against.

Usage: python benchmarks/gpu_layer_timings.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys

LAYERS, HIDDEN, HEADS, INTER = 32, 4096, 32, 11008
TOKENS = (1, 16, 64, 256, 512, 1024, 2048, 4096)
DECODE = ((8, 512), (32, 512), (32, 2048), (128, 1024))
PREFILL = (512, 2048)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("gpu_layer_timings: needs PyTorch with CUDA (run it on a GPU machine)")
    if not torch.cuda.is_available():
        sys.exit("gpu_layer_timings: no CUDA device")
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape: int):  # type: ignore[no-untyped-def]
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen) * 0.02

    w_qkv, w_o = rand(HIDDEN, 3 * HIDDEN), rand(HIDDEN, HIDDEN)
    w_up, w_down = rand(HIDDEN, 2 * INTER), rand(INTER, HIDDEN)
    norm = torch.ones(HIDDEN, device=dev, dtype=dt)

    def timed(fn, reps: int = 30) -> float:  # type: ignore[no-untyped-def]
        for _ in range(5):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[len(times) // 2]

    def layer(x):  # type: ignore[no-untyped-def]
        h = F.rms_norm(x, (HIDDEN,), norm)
        qkv = h @ w_qkv
        x = x + qkv[:, :HIDDEN] @ w_o
        h = F.rms_norm(x, (HIDDEN,), norm)
        gate, up = (h @ w_up).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ w_down

    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "layers": LAYERS}
    linear = {}
    for t in TOKENS:
        x = rand(t, HIDDEN)
        linear[str(t)] = LAYERS * timed(lambda x=x: layer(x))
    out["linear_ms"] = linear
    decode = {}
    for b, c in DECODE:
        q, k, v = rand(b, HEADS, 1, HIDDEN // HEADS), rand(b, HEADS, c, 128), rand(b, HEADS, c, 128)
        decode[f"{b},{c}"] = LAYERS * timed(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v)
        )
    out["decode_attention_ms"] = decode
    prefill = {}
    for n in PREFILL:
        q, k, v = (rand(1, HEADS, n, 128) for _ in range(3))
        prefill[str(n)] = LAYERS * timed(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        )
    out["prefill_attention_ms"] = prefill
    text = json.dumps(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
