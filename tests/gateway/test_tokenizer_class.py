"""The gateway loads the tokenizer class the checkpoint names without AutoTokenizer (whose import of the model
configurations imports torch), and it is the tokenizer AutoTokenizer would give: same class, same rendering of the
chat template, same ids and text."""
import json

from transformers import AutoTokenizer

from gateway.tokenizer import Tokenizer, _tokenizer_class
from specd.default_model import resolve_model_path

CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Count to three, please."}],
]


def test_the_default_model_gets_the_class_and_output_autotokenizer_gives(tokenizer):
    path = resolve_model_path("default")
    auto = AutoTokenizer.from_pretrained(path)
    assert type(tokenizer.hf) is type(auto)
    for messages in CONVERSATIONS:
        assert tokenizer._render(messages) == auto.apply_chat_template(messages, add_generation_prompt=True,
                                                                       tokenize=False)
    text = "def mean(values):\n    return sum(values) / len(values)  # ünïcode, 数字"
    assert tokenizer.encode(text) == auto(text)["input_ids"]
    assert tokenizer.decode(tokenizer.encode(text)) == auto.decode(auto(text)["input_ids"], skip_special_tokens=True)
    assert tokenizer.vocab_size == len(auto) and tokenizer.eos_token_ids == (auto.eos_token_id,)


def test_a_checkpoint_naming_no_known_class_goes_through_autotokenizer(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "NoSuchTokenizer"}))
    assert _tokenizer_class(tmp_path) is AutoTokenizer
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    assert _tokenizer_class(tmp_path) is AutoTokenizer


def test_the_served_families_tokenizer_classes_load_without_autotokenizer(tmp_path):
    """Llama, Qwen2 / Qwen3 and plain fast-tokenizer checkpoints name these; none falls back to AutoTokenizer."""
    for name in ("LlamaTokenizerFast", "Qwen2TokenizerFast", "Qwen2Tokenizer", "PreTrainedTokenizerFast"):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": name}))
        assert _tokenizer_class(tmp_path) is not AutoTokenizer
