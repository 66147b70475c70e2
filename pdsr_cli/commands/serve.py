"""``pdsr serve``: an OpenAI-style endpoint on the engines, every request through the dispatch policy."""

from __future__ import annotations

from pathlib import Path

import click

from pdsr_cli.common import (build_config, check_speculative_flags, config_option, echo_status, handle_errors,
                             parse_policy_sets, policy_option, policy_set_option, quiet_option,
                             speculative_options)


@click.command("serve")
@config_option
@policy_option("Dispatch policy that places each request ({runnable}), a preset, or 'package.module:Class'.  "
               "[default: v3]")
@policy_set_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on (0: any free one).")
@click.option("--model", help="Local Hugging Face model directory.  [default: the built-in tiny random model]")
@click.option("--model-name", "--served-model-name", "model_name", multiple=True,
              help="The model id /v1/models lists and responses name; a request naming another model is a 404, as "
                   "vLLM's server answers it. Repeat it to answer to several names (the first is the responses').  "
                   "[default: the model folder's name, and the --model folder as given]")
@click.option("--max-tokens", type=int, help="Most tokens of a response when a request does not say, and a named "
                                            "sample's whole budget.  [default: 1024]")
@click.option("--temperature", type=float, help="Sampling temperature of every request (a rollout samples with "
                                                "its run's settings).  [default: 1.0]")
@click.option("--top-p", type=float, help="Nucleus sampling mass of every request.  [default: 1.0]")
@click.option("--fast", type=int, help="Engines in the fast pool (automatic layout).")
@click.option("--heavy", type=int, help="Engines in the heavy pool (automatic layout).")
@click.option("--tool-parser", metavar="NAME",
              help="Parse the model's tool calls into tool_calls with this vLLM tool parser (e.g. hermes).  "
                   "[default: none, the text as it is]")
@click.option("--sample-timeout", "sample_timeout_s", type=float, metavar="SECONDS",
              help="A named sample with no request for this long fails.  [default: 60]")
@speculative_options("the earlier responses to the request's prompt",
                     "whose responses are drafted from as earlier responses to the same prompts")
@quiet_option
@handle_errors
def command(config_path, policy, policy_set, host, port, model, model_name, max_tokens, temperature, top_p, fast,
            heavy, tool_parser, sample_timeout_s, speculative, num_speculative_tokens, draft_history, quiet):
    """Serve POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /tokenize and POST /detokenize
    on vLLM engines (and vLLM's GET /health, /ping and /version), with vLLM's server's error bodies.

    Every request is a group placed by the dispatch policy, as a rollout's groups are. A chat or completions
    request that names a sample (header X-Pdsr-Sample, or "pdsr_sample" in the body) is recorded token-exact
    across its requests; POST /v1/pdsr/samples/ID/end (body {"reward": R}) ends it and returns its
    trajectory, with response_mask and per-token log-probs. stream=true streams the tokens as the engines make
    them, in vLLM's server's chunks (a named sample's turn too; with --tool-parser hermes, a tool call's name and
    then its arguments as they are written; another parser's calls come whole at the turn's end). See
    docs/agents.md.

    \b
    Examples:
      pdsr serve                                   # tiny model, v3, http://127.0.0.1:8000/v1
      pdsr serve --model DIR --port 8000 --tool-parser hermes --max-tokens 4096
      pdsr serve --model DIR --speculative ngram --num-speculative-tokens 4
    """
    from pdsr_cli.commands.rollout import check_functions
    from pdsr_cli.quiet import output_mode, quiet_engine_args, stderr_is_terminal
    from pdsr_sdk.agent.tools import check_tool_parser
    from pdsr_sdk.policies.resolve import with_policy_sets
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession
    from pdsr_sdk.rollout.serve_model import served_names
    from pdsr_sdk.rollout.session_serve import check_listen_address, check_serve_config

    overrides = {"policy": policy, "model": model, "sampling.max_tokens": max_tokens,
                 "sampling.temperature": temperature, "sampling.top_p": top_p, "fast": fast, "heavy": heavy,
                 "agent.env_timeout_s": sample_timeout_s, "speculative": speculative,
                 "speculative_settings.num_speculative_tokens": num_speculative_tokens,
                 "speculative_settings.history_file": draft_history}
    cfg = with_policy_sets(build_config(RolloutConfig, config_path, overrides), parse_policy_sets(policy_set))
    check_speculative_flags(cfg, num_speculative_tokens)
    check_serve_config(cfg)   # before the engines start
    check_functions(cfg, config_path, {})   # a --config file's reward or agent.function (serve has no flag)
    check_listen_address(host, port, host_flag="--host", port_flag="--port")
    served_names(list(model_name), "", flag="--model-name")   # an empty name: before the engines start
    check_tool_parser(tool_parser, "--tool-parser")   # before the engines start
    if cfg.model is None:
        echo_status("model: the built-in tiny random model (pass --model DIR for a real one)")
    if quiet or not stderr_is_terminal():
        cfg = quiet_engine_args(cfg, quiet)   # vLLM's weight-loading bar, as pdsr rollout turns it off
    session = RolloutSession(cfg)
    session.hooks.on_status.append(echo_status)

    def ready(bound: int) -> None:
        echo_status(f"serving {session.model_dir and Path(session.model_dir).name} at http://{host}:{bound}/v1 "
                    f"(Ctrl-C stops)")

    with output_mode(quiet), session:
        session.serve(host, port, model_name=list(model_name) or None, tool_parser=tool_parser, on_ready=ready)

