"""Multi-turn rollouts with a tool: math problems, a calculator, token-exact trajectories.

Each sample is an agent (``async def run(agent)``, :mod:`pdsr_sdk.agent`): the model answers, and where it
calls the calculator (``<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>``,
the Hermes convention of ChatML models, parsed by ``pdsr_sdk.agent.parse_tool_calls``) the environment appends the
result as a ``tool`` message and the model goes on. The reward is ``math_boxed`` on the last turn.

    python examples/agent_tools.py --smoke                          # tiny model, built-in prompts, ~2 min
    python examples/agent_tools.py --model DIR --data math500.parquet --n 8 --batch-size 16
    pdsr rollout --agent examples.agent_tools:run --system-prompt "$(python examples/agent_tools.py --system)" ...

``--smoke`` runs the built-in tiny (random) model, which almost never writes a well-formed call: there the
environment also adds scripted user turns (asking it to check with the calculator), so every sample takes
several turns; ``tool_calls`` counts only real, parsed calls. It ends with one JSON line: ``trajectories``,
``turns_mean``, ``tool_calls``, ``token_mismatches`` (turn prompts, as vLLM received them, that differ from
the trajectory's ids: 0), ``turn_requests`` (the requests the engines received, each one checked), ``failed``
(samples whose agent failed) and ``reward_mean`` (about 0 for the random model).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import math
import operator

SYSTEM = ("You can use a calculator. To call it, write <tool_call>{\"name\": \"calculator\", \"arguments\": "
          "{\"expression\": \"12*7+3\"}}</tool_call> and wait for the result. Put your final answer within "
          "\\boxed{}.")
NUDGE = "Check your arithmetic with the calculator, then give the final answer within \\boxed{}."
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Mod: operator.mod}


#: the most bits of an integer result: one a float holds, so the answer can be formatted (and no power tower runs for
#: minutes on the event loop)
MAX_BITS = 1000


def _checked(value: object) -> float:
    if isinstance(value, complex):
        raise ValueError("not a real number")
    if (isinstance(value, int) and value.bit_length() > MAX_BITS
            or isinstance(value, float) and not math.isfinite(value)):
        raise ValueError("result too large")
    return value


def calculate(expression: object) -> str:
    """The calculator tool: + - * / % ** and parentheses over numbers; an error message for anything else."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return _checked(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            right = ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            left = ev(node.left)
            if isinstance(node.op, ast.Pow) and isinstance(left, int) and abs(left).bit_length() * right > MAX_BITS:
                raise ValueError("result too large")   # said before it is computed
            return _checked(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _checked(_OPS[type(node.op)](ev(node.operand)))
        raise ValueError("only numbers and + - * / % ** ( )")
    try:
        value = ev(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


async def solve(agent, *, scripted: bool) -> dict:
    """One sample: turns until the model answers without a call (or, ``scripted``, after the nudges)."""
    from pdsr_sdk.agent import parse_tool_calls
    from pdsr_sdk.rollout.reward import math_boxed

    turn = await agent.generate()
    calls_made = nudges = 0
    while True:
        text = agent.tokenizer.decode(turn.token_ids, skip_special_tokens=False)
        _, calls = parse_tool_calls(text, agent.tokenizer, "hermes")
        if calls:
            for call in calls:
                result = (calculate(call.arguments.get("expression")) if call.name == "calculator"
                          else f"error: no tool named {call.name!r}")
                agent.append([{"role": "tool", "content": result}], tool_name=call.name)
            calls_made += len(calls)
        elif scripted and nudges < 2:
            agent.append([{"role": "user", "content": NUDGE}])
            nudges += 1
        else:
            break
        if agent.turns_left <= 0:
            break
        if agent.tokens_left < 24:   # too little for an answer: the sample ends `length`, as the budget cut it
            agent.stop_for_budget()
            break
        turn = await agent.generate()
    return {"score": math_boxed(turn.text, agent.ground_truth), "tool_calls": calls_made}


async def run(agent) -> dict:
    """The agent ``pdsr rollout --agent examples.agent_tools:run`` runs."""
    return await solve(agent, scripted=False)


async def run_scripted(agent) -> dict:
    return await solve(agent, scripted=True)


async def smoke(session, prompts) -> dict:
    """One step of ``run_scripted`` on ``session``'s engines, and the smoke line (see the module)."""
    from pdsr_sdk.engines.request_observer import PromptLog

    engines = [e for e in session.engines if hasattr(e, "observer")]   # vLLM engines in this process
    logs = [PromptLog() for _ in engines]
    for e, plog in zip(engines, logs):
        e.observer = plog
    try:
        out = await session.astep(prompts, agent=run_scripted)
        log = [x for plog in logs for x in plog.entries]
    finally:
        for e in engines:
            e.observer = None
    samples = {s.key: s for s in out.samples}
    mismatches = 0
    for request_id, got in log:
        s = samples[request_id.split("#")[0]]
        prompt = s.group.prompt_token_ids
        mismatches += got != prompt + s.token_ids[:len(got) - len(prompt)]
    rows = out.table.to_pylist()
    return {"trajectories": len(rows), "turns_mean": out.summary.get("turns_mean", 0.0),
            "tool_calls": sum(extra(r).get("tool_calls", 0) for r in rows),
            "token_mismatches": mismatches, "turn_requests": len(log), "failed": out.summary.get("agent_failed", 0),
            "reward_mean": out.summary["reward_mean"]}


def extra(row: dict) -> dict:
    """A row's reward_extra: a struct (a dict) where every row has the same keys, else JSON text."""
    value = row["reward_extra"] or {}
    return json.loads(value) if isinstance(value, str) else value


def config(args):
    from pdsr_sdk.rollout.config import RolloutConfig

    return RolloutConfig(
        model=args.model, data={"path": args.data, "system_prompt": SYSTEM, "limit": args.batch_size},
        sampling={"n": args.n, "max_tokens": args.max_tokens, "temperature": 1.0}, batch_size=args.batch_size,
        agent={"max_turns": args.max_turns, "turn_max_tokens": args.turn_tokens}, reward="math_boxed",
        **({"engine_defaults": {"dtype": "float32"}} if args.smoke else {}))


async def main(args) -> None:
    from pdsr_sdk.rollout.session import RolloutSession

    async with RolloutSession(config(args)) as session:
        prompts = session.load_prompts()
        if args.smoke:
            print(json.dumps(await smoke(session, prompts)), flush=True)
            return
        out = await session.astep(prompts, agent=run)
        keep = ("samples", "turns_mean", "agent_failed", "reward_mean", "tokens", "env_tokens", "env_s", "makespan_s")
        print(json.dumps({k: out.summary.get(k) for k in keep}), flush=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny model, built-in prompts, scripted turns, one JSON line")
    p.add_argument("--system", action="store_true", help="print the system prompt that describes the tool, and exit")
    p.add_argument("--model", help="model folder (default: the built-in tiny model)")
    p.add_argument("--data", help="prompts with a ground truth (default: the built-in sample prompts)")
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=192, help="every response token, the model's and the tools'")
    p.add_argument("--turn-tokens", type=int, default=48, help="most tokens one model turn samples")
    p.add_argument("--max-turns", type=int, default=4)
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse()
    if ARGS.system:
        print(SYSTEM)
    else:
        asyncio.run(main(ARGS))
