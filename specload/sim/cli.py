"""``specload sim`` / ``python -m specload.sim``: flags -> engine, faults, app, server; then serve.

Every ``--fault-*`` flag stores into ``fault_<field>`` of :class:`~specload.sim.faults.Faults`, so
:func:`build_faults` is a loop over the fields; the per-fault ``*-every`` / ``*-rate`` flags default
to None, meaning "use --fault-every / --fault-rate".
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import fields
from typing import Any

import gevent
from gevent.event import Event

from specload.sim.app import SimApp, require_api_key
from specload.sim.eos import EosLength, parse_eos_length
from specload.sim.faults import FAULT_NAMES, HTTP_ERROR_STATUSES, Faults
from specload.sim.httpd import App, HTTPServer
from specload.sim.info import METRICS_STYLES
from specload.sim.prefix import DEFAULT_BLOCK, PrefixCache
from specload.sim.protocol import Vocab, error_body
from specload.sim.specfields import PER_REQUEST_LEVELS
from specload.sim.timing import Engine, FixedEngine, clock

_FAULT_DEST = "fault_"  # argparse dest prefix of a Faults field


# ---------------------------------------------------------------------------------------------------
# Flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specload sim",
        description="Simulated LLM inference server (OpenAI / vLLM / SGLang endpoints) with exactly known timing.",
    )
    _add_basic_flags(p)
    _add_timing_flags(p)
    _add_fault_flags(p)
    _add_security_flags(p)
    return p


def _add_basic_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, default=30000, help="port to bind; 0 picks a free one (default 30000)")
    a("--model", default="specload-sim", help="served model name (default specload-sim)")
    a("--max-model-len", type=int, default=8192, help="context length; longer requests get HTTP 400")
    a(
        "--metrics-style",
        choices=METRICS_STYLES,
        default="sglang",
        help="/metrics gauge names; none = 404 (default sglang; vllm with --max-num-seqs)",
    )
    a(
        "--max-num-seqs",
        type=int,
        default=None,
        metavar="N",
        help="answer as vLLM does, with its running cap N (vLLM's --max-num-seqs; sets --max-running, or the batch "
        "engine's max_running_requests): vllm:* gauges, no SGLang /get_server_info, and /server_info only with "
        "--vllm-server-dev-mode",
    )
    a(
        "--vllm-server-dev-mode",
        action="store_true",
        help="with --max-num-seqs: serve vLLM's dev-mode /server_info (VLLM_SERVER_DEV_MODE=1), which says max_num_seqs",
    )
    # What a real llama.cpp server does that a client must cope with (docs/simulator.md).
    a(
        "--vocab-size",
        type=int,
        default=None,
        help="token ids must be below this (HTTP 400 'Prompt contains "
        "invalid tokens', as llama.cpp); /tokenize maps words into it (default: no check, 32000 for /tokenize)",
    )
    a("--chat-template-tokens", type=int, default=0, help="tokens a chat template adds to every chat prompt")
    a(
        "--close-after-stream",
        action="store_true",
        help="close the connection after each streamed response while advertising keep-alive, as llama.cpp does",
    )
    a(
        "--loading-s",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="answer every endpoint (/health too) with HTTP 503 'Loading model' for this long after start, as llama.cpp does",
    )
    a(
        "--eos-length",
        default=None,
        metavar="MIN:MAX",
        help="the model ends each answer itself (finish_reason stop) after a length drawn uniformly from MIN..MAX, "
        "in arrival order from --eos-seed, unless the request sets ignore_eos (default: it never does; every "
        "answer runs to max_tokens)",
    )
    a("--eos-seed", type=int, default=0, help="seed of the --eos-length draws (default 0)")
    a("--access-log", action="store_true", help="log every request to stderr")


def _add_timing_flags(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group(
        "timing",
        "--engine fixed (default): fixed TTFT and ITL behind --max-running (the flags below). --engine batch: "
        "continuous batching with optional speculative decoding, parameters from --preset (docs/simulator.md).",
    )
    t.add_argument("--engine", choices=("fixed", "batch"), default="fixed", help="timing model")
    t.add_argument(
        "--preset",
        default=None,
        help="batch engine parameters: baseline, mtp, ngram, or a TOML file of them (default baseline)",
    )
    t.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="batch engine: override one preset parameter (a TOML value), e.g. spec_max_running_requests=128",
    )
    t.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        metavar="K",
        help="batch engine: draft tokens per step, as SGLang's flag (the preset's spec_num_steps)",
    )
    t.add_argument("--ttft-ms", type=float, default=50.0, help="time to first token after admission")
    t.add_argument("--itl-ms", type=float, default=10.0, help="time between tokens")
    t.add_argument("--prefill-us-per-token", type=float, default=0.0, help="extra TTFT per prompt token")
    t.add_argument("--max-running", type=int, default=48, help="running-request cap; the rest queue FIFO")
    t.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per stream event after the first")
    t.add_argument("--time-scale", type=float, default=1.0, help="multiply every engine duration")
    t.add_argument(
        "--speed-up-after",
        type=int,
        default=None,
        metavar="N",
        help="fixed engine: every request admitted after the first N runs --speed-up times faster (a server "
        "whose speed changes mid-run, e.g. a warm-up; default: never)",
    )
    t.add_argument(
        "--speed-up", type=float, default=2.0, metavar="F", help="see --speed-up-after (default 2)"
    )
    t.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=0,
        metavar="N",
        help="a prefix cache of N tokens (LRU): a prompt's cached start skips its prefill (default 0: off)",
    )
    t.add_argument(
        "--prefix-cache-block",
        type=int,
        default=DEFAULT_BLOCK,
        metavar="B",
        help=f"the prefix cache matches whole blocks of B tokens (default {DEFAULT_BLOCK}, as vLLM)",
    )
    t.add_argument(
        "--reasoning-tokens",
        type=int,
        default=0,
        metavar="N",
        help="chat: stream each answer's first N tokens as reasoning deltas, and count them in usage "
        "completion_tokens_details.reasoning_tokens, as vLLM with a --reasoning-parser (default 0: none)",
    )
    t.add_argument(
        "--reasoning-field",
        choices=("reasoning", "reasoning_content"),
        default="reasoning",
        help="the reasoning delta's field, and how a chunk across the reasoning's end is split: vLLM's "
        "'reasoning' (default; one delta with both fields) or SGLang's 'reasoning_content' (two chunks)",
    )
    t.add_argument(
        "--emission-log",
        metavar="FILE",
        default=None,
        help="append one JSON line per finished stream: when its first and last token events went to the "
        "socket (the simulator's clock, seconds) and their tokens, for tests that hold a client to it",
    )
    t.add_argument(
        "--cache-report",
        action="store_true",
        help="OpenAI usage carries prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details)",
    )
    t.add_argument(
        "--per-request-spec-decode-metrics",
        choices=PER_REQUEST_LEVELS,
        default="none",
        help="as vLLM's flag: OpenAI responses (and the final usage chunk) carry metrics.speculative_decoding; "
        "detailed adds per_step_accepted/per_step_drafted (batch engine with speculation)",
    )


def _add_fault_flags(p: argparse.ArgumentParser) -> None:
    f = p.add_argument_group(
        "faults",
        "Each fault hits every Nth generation request (--fault-X-every), else a random fraction "
        "(--fault-X-rate), else the --fault-every / --fault-rate defaults, else every request.",
    )
    fa = f.add_argument
    # Every flag stores into fault_<Faults field>; dest is given where the flag's name is shorter.
    fa("--fault-every", type=int, default=0, help="default every-Nth for the faults below")
    fa("--fault-rate", type=float, default=0.0, help="default probability for the faults below")
    fa("--fault-seed", type=int, default=0, help="seed of the fault RNG")
    fa(
        "--fault-from",
        dest="fault_first",
        type=int,
        default=1,
        metavar="N",
        help="faults hit generation requests from the Nth on (default 1: all)",
    )
    fa(
        "--fault-http-status",
        dest="fault_http_error_status",
        type=int,
        choices=HTTP_ERROR_STATUSES,
        default=0,
        help="answer with this status",
    )
    _add_every_rate(f, "http", "http_error")
    fa(
        "--fault-cut-after",
        dest="fault_cut_after_tokens",
        type=int,
        default=None,
        metavar="K",
        help="drop the connection after K tokens",
    )
    _add_every_rate(f, "cut", "cut")
    fa(
        "--fault-stall-after",
        dest="fault_stall_after_tokens",
        type=int,
        default=None,
        metavar="K",
        help="stop sending after K tokens ...",
    )
    fa("--fault-stall-s", type=float, default=1.0, help="... for this many seconds (default 1, unscaled)")
    _add_every_rate(f, "stall", "stall")
    fa("--fault-malformed-every", type=int, default=0, help="every Nth stream gets 'data: {not json' mid-way")
    fa("--fault-malformed-rate", type=float, default=0.0)
    fa("--fault-omit-done", action="store_true", help="end streams without 'data: [DONE]'")
    _add_every_rate(f, "omit-done", "omit_done")
    fa("--fault-short-by", type=int, default=0, metavar="N", help="finish N tokens short (honest usage)")
    _add_every_rate(f, "short", "short")
    fa(
        "--fault-die-after",
        dest="fault_die_after_requests",
        type=int,
        default=0,
        metavar="N",
        help="exit the process at the Nth admission",
    )


def _add_every_rate(group: argparse._ArgumentGroup, name: str, field: str) -> None:
    """--fault-NAME-every / -rate; None (the default) defers to --fault-every / --fault-rate."""
    for kind, kind_type in (("every", int), ("rate", float)):
        flag = f"--fault-{name}-{kind}"
        metavar = flag[2:].replace("-", "_").upper()  # the name argparse would show
        group.add_argument(flag, dest=f"fault_{field}_{kind}", metavar=metavar, type=kind_type, default=None)


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server", "TLS and API key, as a production server would have them.")
    s.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="PEM certificate: serve https (with --tls-key)"
    )
    s.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    s.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* and /generate (else HTTP 401)",
    )


# ---------------------------------------------------------------------------------------------------
# Flags -> objects


def build_engine(args: argparse.Namespace) -> Engine:
    cache = None
    if getattr(args, "prefix_cache_tokens", 0):
        cache = PrefixCache(args.prefix_cache_tokens, args.prefix_cache_block)
    if args.engine == "batch":
        from specload.sim.batch import BatchEngine

        if args.speed_up_after is not None:
            raise ValueError("--speed-up-after needs --engine fixed")

        params = list(args.param)
        if args.speculative_num_steps is not None:  # SGLang's flag for the draft length
            params.append(f"spec_num_steps={args.speculative_num_steps}")
        if args.max_num_seqs is not None:
            params += [
                f"max_running_requests={args.max_num_seqs}",
                f"spec_max_running_requests={args.max_num_seqs}",
            ]
        return BatchEngine.from_preset(
            args.preset or "baseline", params, time_scale=args.time_scale, prefix_cache=cache
        )
    if args.preset is not None or args.param or args.speculative_num_steps is not None:
        raise ValueError("--preset, --param and --speculative-num-steps need --engine batch")
    return FixedEngine(
        ttft_s=args.ttft_ms / 1e3,
        itl_s=args.itl_ms / 1e3,
        max_running=args.max_num_seqs if args.max_num_seqs is not None else args.max_running,
        prefill_per_token_s=args.prefill_us_per_token / 1e6,
        tokens_per_chunk=args.tokens_per_chunk,
        time_scale=args.time_scale,
        prefix_cache=cache,
        speed_up_after=args.speed_up_after,
        speed_up=args.speed_up,
    )


def build_faults(args: argparse.Namespace) -> Faults:
    """The ``--fault-*`` flags as :class:`Faults`; a fault with neither its own every nor rate set
    takes ``--fault-every`` / ``--fault-rate``."""
    values = {f.name: getattr(args, _FAULT_DEST + f.name) for f in fields(Faults)}
    for name in FAULT_NAMES:
        every, rate = values[f"{name}_every"], values[f"{name}_rate"]
        if every is None and rate is None:
            every, rate = args.fault_every, args.fault_rate
        values[f"{name}_every"], values[f"{name}_rate"] = every or 0, rate or 0.0
    faults = Faults(**values)
    faults.validate()
    return faults


def tls_context(cert_file: str, key_file: str) -> Any:
    """A server-side TLS context holding the certificate and key.

    gevent's own SSLContext class: ``gevent.ssl.create_default_context`` is the standard library's
    and makes blocking sockets, one of which idle on keep-alive would stall the whole server.
    """
    import gevent.ssl

    ctx = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def make_server(
    app: SimApp,
    host: str = "127.0.0.1",
    port: int = 0,
    access_log: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    api_key: str | None = None,
) -> HTTPServer:
    """A bound-on-start server for ``app``; ``port=0`` picks a free port (see ``server_port``).

    ``tls_cert`` + ``tls_key`` (PEM files): serve https. ``api_key``: generation and model endpoints
    answer 401 unless the request carries ``Authorization: Bearer <api_key>``.
    """
    if api_key and isinstance(app, SimApp):
        # SGLang's /get_server_info hands out its own keys: so does the simulator (clients must scrub them).
        app.secrets = {"api_key": api_key, "admin_api_key": None, "ssl_keyfile_password": None}
    handler: App = app if not api_key else require_api_key(app, api_key)
    return HTTPServer(
        (host, port),
        handler,
        clock=clock,  # Request.arrived on the engine's clock
        error_body=error_body,
        log=sys.stderr if access_log else None,
        backlog=1024,
        ssl_context=tls_context(tls_cert, tls_key) if tls_cert and tls_key else None,
    )


# ---------------------------------------------------------------------------------------------------
# The process


def main(argv: list[str] | None = None) -> int:
    """Run the simulator until SIGTERM / SIGINT; prints one 'listening' line for parent processes."""
    parser = build_parser()
    args = parser.parse_args(argv)
    server = _server_from_args(parser, args)
    try:
        server.start()
    except OSError as e:
        print(f"specload-sim: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    _serve_until_signalled(server, args.host)
    return 0


def _server_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> HTTPServer:
    """The configured server, not yet listening; a bad flag exits through ``parser.error``."""
    try:
        engine = build_engine(args)
        faults = build_faults(args)
        app = SimApp(
            engine,
            args.model,
            args.max_model_len,
            "vllm"
            if args.max_num_seqs is not None and args.metrics_style == "sglang"
            else args.metrics_style,
            faults,
            vocab=Vocab(args.vocab_size, args.chat_template_tokens),
            close_after_stream=args.close_after_stream,
            loading_s=args.loading_s,
            cache_report=args.cache_report,
            spec_metrics=args.per_request_spec_decode_metrics,
            reasoning_tokens=args.reasoning_tokens,
            reasoning_field=args.reasoning_field,
            vllm=args.max_num_seqs is not None,
            vllm_dev_mode=args.vllm_server_dev_mode,
            emission_log=open(args.emission_log, "a", encoding="utf-8") if args.emission_log else None,  # noqa: SIM115
            eos=None
            if args.eos_length is None
            else EosLength(*parse_eos_length(args.eos_length), args.eos_seed),
        )
    except ValueError as e:
        parser.error(str(e))
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.api_key is not None and not args.api_key:
        parser.error("--api-key must not be empty")
    try:
        return make_server(
            app, args.host, args.port, args.access_log, args.tls_cert, args.tls_key, args.api_key
        )
    except OSError as e:  # unreadable or mismatched certificate / key (ssl.SSLError is an OSError)
        parser.error(f"cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {e}")


def _serve_until_signalled(server: HTTPServer, host: str) -> None:
    """Announce the address, then serve until SIGTERM / SIGINT."""
    # Handlers first: a parent may send SIGTERM the moment it reads the listening line.
    stop = Event()
    handlers = [gevent.signal_handler(sig, stop.set) for sig in (signal.SIGTERM, signal.SIGINT)]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if server.ssl_enabled else "http"
    print(f"specload-sim listening on {scheme}://{shown}:{server.server_port}", flush=True)
    try:
        stop.wait()
    finally:
        for h in handlers:
            h.cancel()
        server.stop(timeout=0.5)
