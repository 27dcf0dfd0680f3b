"""``s2d2 serve`` (an OpenAI-compatible server) and ``s2d2 bench-serve`` (its load generator)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import S2D2Error
from .options import (
    DeviceFlags,
    EnforceEagerOpt,
    GenerationConfigOpt,
    LoadBlockOpt,
    ModelOpt,
    PageSizeOpt,
    ParallelFlags,
    PresetOpt,
    RevisionOpt,
    check_at_least,
    check_kv_options,
    load_model,
    option_groups,
    require_modules,
)

HostOpt = Annotated[str, typer.Option(help="Address to listen on.")]
PortOpt = Annotated[int, typer.Option(help="Port to listen on.")]
#: The server's rows by default: every client of a busy server decodes in the running batch (keys and
#: values are paged and taken as rows grow, so rows cost memory only as they use it).
SERVE_MAX_NUM_SEQS = 64
RowsOpt = Annotated[
    int,
    typer.Option(
        "--max-num-seqs",
        help="Rows the engine decodes together (memory is taken as rows grow; --kv-budget-tokens bounds it).",
    ),
]
QueueOpt = Annotated[int, typer.Option("--max-queue", help="Requests that may wait for a row (then 429).")]
GraceOpt = Annotated[
    float,
    typer.Option(help="Seconds running requests get to finish after SIGTERM (new ones get 503 meanwhile)."),
]
BodyOpt = Annotated[int, typer.Option("--max-body-bytes", help="Largest request body (413 above).")]
NameOpt = Annotated[
    str | None, typer.Option("--served-name", help="Model id clients use (default: --model).")
]
LogOpt = Annotated[str, typer.Option("--log-level", help="uvicorn log level.")]
RayOpt = Annotated[bool, typer.Option("--ray", help="Serve on Ray Serve (the optional extra 'ray').")]
ReplicasOpt = Annotated[int, typer.Option(help="Ray Serve replicas (with --ray).")]
QueryTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-query-tokens-per-row",
        help="Most query tokens one request may feed to one forward (block size, verification, fused "
        "pre-drafts, prefill chunk); a request over it gets a 400 naming the setting. Default: every "
        "shipped preset fits.",
        show_default=False,
    ),
]
TablesOpt = Annotated[
    int,
    typer.Option(
        "--max-routing-tables",
        help="Engine-scope routing tables kept (one per distinct ucb_scope=engine settings; least "
        "recently used evicted, counted in /metrics).",
    ),
]
KeepAliveOpt = Annotated[
    float,
    typer.Option(
        "--timeout-keep-alive",
        help="Seconds an idle connection, or one whose request head has not fully arrived, stays open.",
    ),
]
BodyTimeoutOpt = Annotated[
    float, typer.Option("--body-timeout", help="Seconds a request body may take to arrive (408 after).")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="S2D2_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every /v1 route, /openapi.json and /docs (401 "
        "otherwise); /health and /metrics stay open. Also read from S2D2_API_KEY.",
        show_default=False,
    ),
]
HostsOpt = Annotated[
    str | None,
    typer.Option(
        "--allowed-hosts",
        help="Host header names accepted, comma-separated ('*': any). Default: the bound address and "
        "localhost, 127.0.0.1, ::1.",
        show_default=False,
    ),
]
RoutingStateOpt = Annotated[
    Path | None,
    typer.Option(
        "--routing-state",
        help="JSON file of the ucb_scope=engine routing statistics: loaded at start if it exists, written "
        "at shutdown (not with --ray).",
        show_default=False,
    ),
]


PrefixCacheOpt = Annotated[
    bool,
    typer.Option(
        "--prefix-cache/--no-prefix-cache",
        help="Reuse the cached keys/values of equal prompt prefixes across requests (system prompts, "
        "few-shot examples, earlier chat turns).",
    ),
]
KVBudgetOpt = Annotated[
    int | None,
    typer.Option(
        "--kv-budget-tokens",
        help="Most cached positions all rows hold together (a budget of pages; rows take pages as they "
        "grow, and the newest row is preempted and later resumed when they run out). Default: no bound.",
        show_default=False,
    ),
]
CostProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--cost-profile",
        help="A step-cost profile for the planner of plan=auto requests: a profile file (calibrated when "
        "missing) or roofline:NAME.",
    ),
]
ToolParserOpt = Annotated[
    str | None,
    typer.Option(
        "--tool-call-parser",
        help="The tool-call format the model writes (hermes, llada2); default: detected from the chat "
        "template (hermes when it says nothing).",
    ),
]
ReasoningParserOpt = Annotated[
    str | None,
    typer.Option(
        "--reasoning-parser",
        help="Split the reply's reasoning into reasoning_content (qwen3: <think> blocks) or none; default: "
        "detected from the chat template (qwen3 where it writes <think>).",
    ),
]
AutoToolOpt = Annotated[
    bool,
    typer.Option(
        "--enable-auto-tool-choice",
        help="Accepted as vLLM takes it; tool_choice auto is always available here.",
    ),
]
BatchedTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-batched-tokens",
        help="Most query tokens of one engine step, all rows together (the planner keeps it).",
    ),
]


def _check_reasoning_parser(name: str | None) -> None:
    """A one-line error for an unknown ``--reasoning-parser``, before the model loads."""
    from ..serving.reasoning.parser import PARSERS

    if name is not None and name != "none" and name not in PARSERS:
        raise S2D2Error(
            f"unknown reasoning parser {name!r}; choose one of: none, {', '.join(sorted(PARSERS))}"
        )


@option_groups
def serve_command(
    *,
    model: ModelOpt = "tiny-gsm",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    preset: PresetOpt = None,
    max_num_seqs: RowsOpt = SERVE_MAX_NUM_SEQS,
    max_queue: QueueOpt = 64,
    grace: GraceOpt = 30.0,
    max_body_bytes: BodyOpt = 1 << 20,
    served_name: NameOpt = None,
    placement: DeviceFlags,
    log_level: LogOpt = "info",
    ray: RayOpt = False,
    replicas: ReplicasOpt = 1,
    routing_state: RoutingStateOpt = None,
    max_query_tokens_per_row: QueryTokensOpt = None,
    max_routing_tables: TablesOpt = 256,
    timeout_keep_alive: KeepAliveOpt = 5.0,
    body_timeout: BodyTimeoutOpt = 30.0,
    api_key: ApiKeyOpt = None,
    allowed_hosts: HostsOpt = None,
    prefix_cache: PrefixCacheOpt = True,
    kv_page_size: PageSizeOpt = 16,
    kv_budget_tokens: KVBudgetOpt = None,
    cost_profile: CostProfileOpt = None,
    max_num_batched_tokens: BatchedTokensOpt = None,
    revision: RevisionOpt = None,
    enforce_eager: EnforceEagerOpt = False,
    tool_call_parser: ToolParserOpt = None,
    reasoning_parser: ReasoningParserOpt = None,
    enable_auto_tool_choice: AutoToolOpt = False,
    parallel: ParallelFlags,
    block_size: LoadBlockOpt = None,
    generation_config: GenerationConfigOpt = "auto",
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (completions, chat completions, streaming)."""
    require_modules(
        "fastapi", "uvicorn", hint="s2d2 serve needs FastAPI and uvicorn: pip install 's2d2[serve]'"
    )
    from ..serving.security import default_allowed_hosts

    _check_serve_options(max_num_seqs, max_queue, port, grace, max_body_bytes)
    _check_robustness_options(max_query_tokens_per_row, max_routing_tables, timeout_keep_alive, body_timeout)
    if api_key is not None and not api_key.strip():
        raise S2D2Error("--api-key (or S2D2_API_KEY) must not be empty")
    _check_reasoning_parser(reasoning_parser)
    check_kv_options(kv_page_size, kv_budget_tokens)
    memory = dict(prefix_cache=prefix_cache, kv_page_size=kv_page_size, kv_budget_tokens=kv_budget_tokens,
                  enforce_eager=enforce_eager)  # fmt: skip
    if revision is not None:
        memory["revision"] = revision
    memory.update(parallel.load_options())
    memory.update(block_size=block_size, generation_config=generation_config)
    hosts = [h.strip() for h in allowed_hosts.split(",") if h.strip()] if allowed_hosts else None
    options = dict(
        preset=preset,
        max_num_seqs=max_num_seqs,
        max_queue=max_queue,
        max_body_bytes=max_body_bytes,
        served_name=served_name,
        max_query_tokens_per_row=max_query_tokens_per_row,
        max_routing_tables=max_routing_tables,
        body_timeout=body_timeout,
        api_key=api_key,
        allowed_hosts=hosts or default_allowed_hosts(host),
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
    )
    if ray:
        if cost_profile is not None or max_num_batched_tokens is not None:
            raise S2D2Error("--cost-profile and --max-num-batched-tokens do not apply with --ray yet")
        if routing_state is not None:
            raise S2D2Error("--routing-state does not apply with --ray (each replica learns on its own)")
        from ..model_source import resolve_model_path
        from ..serving.ray import serve_ray

        resolve_model_path(model, revision)  # a missing model fails here, one line, before Ray starts
        serve_ray(
            model,
            host=host,
            port=port,
            grace=grace,
            replicas=replicas,
            device=placement.device,
            dtype=placement.dtype,
            load_options=memory,
            **options,
        )
        return
    from ..model import freeze_loaded_heap
    from ..serving.app import create_app
    from ..serving.server import serve

    m = load_model(model, placement, max_num_seqs=max_num_seqs, cost_profile=cost_profile,
                   max_num_batched_tokens=max_num_batched_tokens, **memory)  # fmt: skip
    app = create_app(m, routing_state=routing_state, **options)
    freeze_loaded_heap()
    status = serve(
        app, host=host, port=port, grace=grace, log_level=log_level, timeout_keep_alive=timeout_keep_alive
    )
    if status:
        raise SystemExit(status)  # not typer.Exit: the CLI runs click outside standalone mode, which drops it


def _check_serve_options(max_num_seqs: int, max_queue: int, port: int, grace: float, body: int) -> None:
    if max_num_seqs < 1 or max_queue < 0 or port < 0 or grace < 0 or body < 1:
        raise S2D2Error(
            "--max-num-seqs and --max-body-bytes must be >= 1, --max-queue, --port and --grace >= 0"
        )


def _check_robustness_options(tokens: int | None, tables: int, keep_alive: float, body: float) -> None:
    check_at_least("--max-query-tokens-per-row", tokens, 1)
    check_at_least("--max-routing-tables", tables, 1)
    if not keep_alive > 0 or not body > 0:
        raise S2D2Error("--timeout-keep-alive and --body-timeout must be > 0")


UrlOpt = Annotated[str, typer.Option(help="The server's base URL (with or without /v1).")]
ConcOpt = Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")]
NOpt = Annotated[int, typer.Option("--n", help="Requests per concurrency level.")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", help="max_tokens of each request.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds one request may take.")]
ChatOpt = Annotated[bool, typer.Option(help="Use /v1/chat/completions instead of /v1/completions.")]
SetsOpt = Annotated[str | None, typer.Option("--s2d2", help="The s2d2 extension object, as JSON.")]
BackgroundOpt = Annotated[
    int,
    typer.Option(
        "--background",
        help="More clients streaming long requests (256 tokens, ignore_eos) throughout each level, to "
        "measure what that load does to the measured ones.",
    ),
]
SharedPrefixOpt = Annotated[
    int,
    typer.Option(
        "--shared-prefix",
        help="Start every prompt with the same N tokens (worked tiny-gsm dev examples, counted by "
        "--tokenizer): what a server's prefix cache saves shows in TTFT and cached_prompt_tokens.",
    ),
]
TokenizerOpt = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        help="Built-in model name or local checkpoint directory whose tokenizer counts --shared-prefix "
        "(read locally, nothing is fetched).",
    ),
]
BackgroundSetsOpt = Annotated[
    str | None,
    typer.Option("--background-s2d2", help="The background requests' s2d2 extension object, as JSON."),
]


def bench_serve_command(
    url: UrlOpt = "http://127.0.0.1:8000",
    concurrency: ConcOpt = "1,4,16,32",
    n: NOpt = 64,
    max_tokens: MaxTokOpt = 128,
    chat: ChatOpt = False,
    s2d2: SetsOpt = None,
    timeout: TimeoutOpt = 120.0,
    as_json: JsonOpt = False,
    background: BackgroundOpt = 0,
    background_s2d2: BackgroundSetsOpt = None,
    shared_prefix: SharedPrefixOpt = 0,
    tokenizer: TokenizerOpt = "tiny-gsm",
) -> None:
    """Load a running server with streaming requests: tokens/s, TTFT and inter-token latency per level."""
    from ..serving.load import format_table, parse_levels, run_levels

    levels = parse_levels(concurrency)
    if n < 1 or max_tokens < 1 or background < 0 or shared_prefix < 0:
        raise S2D2Error("--n and --max-tokens must be >= 1, --background and --shared-prefix >= 0")
    extension = _json_object("--s2d2", s2d2)
    results = run_levels(
        url,
        levels,
        n=n,
        max_tokens=max_tokens,
        chat=chat,
        extension=extension,
        timeout=timeout,
        background=background,
        background_extension=_json_object("--background-s2d2", background_s2d2),
        shared_prefix_tokens=shared_prefix,
        tokenizer=tokenizer,
    )
    typer.echo(json.dumps(results, indent=2) if as_json else format_table(results))


def _json_object(flag: str, text: str | None) -> dict | None:
    try:
        value = json.loads(text) if text else None
    except json.JSONDecodeError as exc:
        raise S2D2Error(f"{flag} is not valid JSON: {exc}") from None
    if value is not None and not isinstance(value, dict):
        raise S2D2Error(f"{flag} must be a JSON object")
    return value
