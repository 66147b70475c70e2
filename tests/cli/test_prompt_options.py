"""The prompt flags --system-prompt and --instruction on text and chat prompts (issue 15, item 4)."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli


def test_system_prompt_and_instruction_on_text_and_chat_prompts(tiny_model_dir):
    from pdsr_sdk.errors import DataError
    from pdsr_sdk.rollout.config import INSTRUCTIONS, DataConfig
    from pdsr_sdk.rollout.data import add_system_and_instruction, load_tokenizer, prompt_records

    math = INSTRUCTIONS["math"]
    assert math == "Please reason step by step, and put your final answer within \\boxed{}."
    cfg = DataConfig(system_prompt="Be brief.", instruction="math")
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "What is 2+2? "}]
    assert add_system_and_instruction(chat, cfg) == [
        {"role": "system", "content": "Be brief."}, chat[0], chat[1],
        {"role": "user", "content": f"What is 2+2?\n{math}"}]
    assert chat[2]["content"] == "What is 2+2? "                       # the caller's messages are not changed
    tok = load_tokenizer(tiny_model_dir)
    text, chat_rec = prompt_records(["What is 1+1?", chat], cfg, tok)
    assert text.text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+1?\n" + math)
    assert chat_rec.text.count("<|im_start|>system") == 1 and f"What is 2+2?\n{math}<|im_end|>" in chat_rec.text
    plain = prompt_records(["What is 1+1?"], DataConfig(system_prompt="Be brief.", instruction="math",
                                                         apply_chat_template=False), tok)[0]
    assert plain.text == f"Be brief.\n\nWhat is 1+1?\n{math}"
    # a prompt with its own system message: an error, not a silent choice
    with pytest.raises(DataError, match=r"prompts\[0\]: the prompt already has a system message and "
                                        r"data.system_prompt \(--system-prompt\)"):
        prompt_records([[{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]], cfg, tok)
    assert "system\nS" in prompt_records([[{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]],
                                         DataConfig(instruction="math"), tok)[0].text
    with pytest.raises(DataError, match=r"prompts\[0\]: data.instruction \(--instruction\) 'math'.*roles: system"):
        prompt_records([[{"role": "system", "content": "S"}]], DataConfig(instruction="math"), tok)


def test_unknown_instruction_lists_the_valid_names(tmp_path, tiny_model_dir):
    r = CliRunner().invoke(cli, ["rollout", "--instruction", "maths", "--out", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "data.instruction" in r.output and "unknown instruction 'maths'; valid names: math" in r.output
    cfg = tmp_path / "run.yaml"
    cfg.write_text("data:\n  instruction: boxed\n")
    r = CliRunner().invoke(cli, ["rollout", "--config", str(cfg), "--out", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "run.yaml" in r.output and "data.instruction" in r.output and "math" in r.output


def test_resume_must_keep_the_instruction(tmp_path):
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.resume import RESUME_KEYS, run_settings

    assert RESUME_KEYS["data.instruction"] == "--instruction" and RESUME_KEYS["data.system_prompt"] == "--system-prompt"
    assert run_settings(RolloutConfig(data={"instruction": "math"}), "m")["data.instruction"] == "math"
