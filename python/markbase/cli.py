"""The markbase command: run, chat, inspect, bench."""
from __future__ import annotations

import argparse
import os
import sys
import time


def _add_model_args(p, model_optional=True):
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "metal", "cuda"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=4096)


def _load(args):
    from .model import Model
    return Model.load(args.model, backend=args.backend, threads=args.threads,
                      max_context=args.max_context, progress=sys.stderr.isatty() or True)


def _looks_like_model(s: str) -> bool:
    return os.path.exists(s) and (os.path.isdir(s) or s.endswith(".gguf") or os.path.isfile(s))


def cmd_run(args):
    # `markbase run PROMPT` or `markbase run MODEL PROMPT`
    pos = args.args
    if len(pos) == 1:
        args.model, prompt = None, pos[0]
    elif len(pos) == 2:
        args.model, prompt = pos
    else:
        raise SystemExit("usage: markbase run [MODEL] PROMPT")
    m = _load(args)
    t0 = time.perf_counter()
    # generate() checks its arguments and the prompt's length before it returns: an error comes
    # before the prompt is echoed
    pieces = m.generate(prompt, max_tokens=args.n, temperature=args.temp, top_k=args.top_k,
                        top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                        seed=args.seed, stream=True)
    sys.stdout.write(prompt)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = m.stats()
    print(f"[{s['backend']}] prompt {s['prompt_tokens']} tokens, {s['prefill_tok_s']:.1f} tok/s; "
          f"generated {s['generated_tokens']} tokens, {s['decode_tok_s']:.1f} tok/s; "
          f"{time.perf_counter() - t0:.2f} s", file=sys.stderr)


def cmd_chat(args):
    m = _load(args)
    messages = []
    print("markbase chat: an empty line or Ctrl-D ends the conversation.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in m.chat(messages, max_tokens=args.n, temperature=args.temp, stream=True):
            sys.stdout.write(piece)
            sys.stdout.flush()
            reply.append(piece)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def inspect_text(path: str) -> str:
    from . import files
    f = files.open(path)
    md = f.metadata
    lines = [f"file: {path} ({'GGUF' if f.kind == 'gguf' else 'Hugging Face directory'})"]
    if f.kind == "gguf":
        arch = md.get("general.architecture", "?")
        lines.append(f"architecture: {arch}  name: {md.get('general.name', '?')}")
        hp = {k[len(arch) + 1:]: v for k, v in md.items() if k.startswith(arch + ".")}
        for k in sorted(hp):
            v = hp[k]
            if isinstance(v, list) and len(v) > 12:
                v = f"[{len(v)} values] {v[:6]}..."
            lines.append(f"  {k}: {v}")
        tk = md.get("tokenizer.ggml.model")
        toks = md.get("tokenizer.ggml.tokens")
        lines.append(f"tokenizer: {tk} (pre: {md.get('tokenizer.ggml.pre', '-')}), vocabulary "
                     f"{len(toks) if toks else 0} tokens, chat template: "
                     f"{'yes' if 'tokenizer.chat_template' in md else 'no'}")
    else:
        cfg = md.get("text_config", md)
        lines.append(f"architecture: {md.get('architectures', ['?'])[0]}  model_type: {cfg.get('model_type', md.get('model_type'))}")
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "global_head_dim", "intermediate_size",
                  "sliding_window", "num_kv_shared_layers", "hidden_size_per_layer_input",
                  "num_experts", "top_k_experts", "moe_intermediate_size", "final_logit_softcapping"):
            if k in cfg:
                lines.append(f"  {k}: {cfg[k]}")
        tj = os.path.join(path, "tokenizer.json")
        if os.path.exists(tj):
            import json
            with open(tj, encoding="utf-8") as fh:
                t = json.load(fh)
            model = t.get("model", {})
            vocab = model.get("vocab", {})
            lines.append(f"tokenizer: tokenizer.json ({model.get('type', '?')}), vocabulary "
                         f"{len(vocab) + len(t.get('added_tokens', [])) if isinstance(vocab, dict) else len(vocab)} tokens")
        else:
            lines.append("tokenizer: none (no tokenizer.json)")
    by_type: dict[str, list[int]] = {}
    for info in f.tensors.values():
        c = by_type.setdefault(info.type, [0, 0])
        c[0] += 1
        c[1] += info.nbytes
    total = sum(c[1] for c in by_type.values())
    lines.append(f"tensors: {len(f.tensors)}, {_fmt_bytes(total)}")
    for t, (n, b) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {t:6s} {n:5d} tensors  {_fmt_bytes(b):>12s}")
    return "\n".join(lines)


def cmd_inspect(args):
    print(inspect_text(args.model))


def cmd_bench(args):
    from .model import Model
    import statistics
    m = Model.load(args.model, backend=args.backend, threads=args.threads,
                   max_context=max(args.max_context, args.prompt_tokens + args.gen_tokens + 1))
    import random
    rng = random.Random(0)
    V = m.config["vocab_size"]
    prompt = [m.bos_id if m.bos_id is not None else 2] + [rng.randrange(10, V) for _ in range(args.prompt_tokens - 1)]
    pre, dec = [], []
    for _ in range(args.repeats):
        n = 0
        for _tok in m.generate_tokens(prompt, max_tokens=args.gen_tokens, temperature=0):
            n += 1
        s = m.stats()
        pre.append(s["prefill_tok_s"])
        dec.append(s["decode_tok_s"])
    out = dict(model=m.path, backend=s["backend"], prompt_tokens=args.prompt_tokens,
               gen_tokens=args.gen_tokens, prefill_tok_s=statistics.median(pre),
               decode_tok_s=statistics.median(dec), host_waits_per_token=s["host_waits_per_token"],
               kernels_per_token=s["kernels_per_token"])
    if args.json:
        import json
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


def cmd_serve(args):
    try:
        from .server import serve
    except ImportError as e:
        raise SystemExit(f"markbase serve needs FastAPI and uvicorn: pip install 'markbase[server]' ({e})")
    serve(args.model, host=args.host, port=args.port, backend=args.backend, max_context=args.max_context,
          parallel=args.parallel, threads=args.threads, alias=args.alias, log_level=args.log_level)


def main(argv=None):
    p = argparse.ArgumentParser(prog="markbase", description="Run Gemma 3 / Gemma 4 models.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="complete a prompt: markbase run [MODEL] PROMPT")
    r.add_argument("args", nargs="+", metavar="[MODEL] PROMPT")
    r.add_argument("-n", type=int, default=64, help="tokens to generate")
    r.add_argument("--temp", type=float, default=0.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--min-p", type=float, default=0.0)
    r.add_argument("--repeat-penalty", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=None)
    _add_model_args(r)
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("chat", help="interactive chat with the model's template")
    c.add_argument("model", nargs="?", default=None)
    c.add_argument("-n", type=int, default=256)
    c.add_argument("--temp", type=float, default=0.8)
    _add_model_args(c)
    c.set_defaults(fn=cmd_chat)
    i = sub.add_parser("inspect", help="architecture, sizes, tensor types of a model file")
    i.add_argument("model")
    i.set_defaults(fn=cmd_inspect)
    b = sub.add_parser("bench", help="prefill and decode speed")
    b.add_argument("model", nargs="?", default=None)
    b.add_argument("--prompt-tokens", type=int, default=512)
    b.add_argument("--gen-tokens", type=int, default=128)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--json", action="store_true")
    _add_model_args(b)
    b.set_defaults(fn=cmd_bench)
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server: markbase serve [MODEL]")
    sv.add_argument("model", nargs="?", default=None)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--parallel", type=int, default=1, help="requests generated at once (one model per slot)")
    sv.add_argument("--alias", default=None, help="the model id the API reports (default: the file name)")
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    _add_model_args(sv)
    sv.set_defaults(fn=cmd_serve)
    args = p.parse_args(argv)
    from . import _core
    try:
        args.fn(args)
    except (FileNotFoundError, ValueError, _core.FormatError, _core.BackendError) as e:
        print(f"markbase: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
