import pytest

from specviz.models.tiny import tiny_model, tiny_tokenizer


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target(tok):
    return tiny_model(len(tok), seed=0, layers=3)


@pytest.fixture(scope="session")
def draft(tok):
    return tiny_model(len(tok), seed=1, layers=1)


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory):
    """The tiny pair saved as two model folders (target, draft), for the command lines."""
    from specviz.models.tiny import save_tiny_pair
    return save_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def other_vocab_dir(tmp_path_factory):
    """A model whose tokenizer differs from the tiny pair's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    d = tmp_path_factory.mktemp("other-vocab")
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate("abcdefgh")}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>").save_pretrained(d)
    tiny_model(16, seed=3, layers=1).save_pretrained(d)
    return str(d)


@pytest.fixture
def one_thread():
    """Tiny matrices: OpenMP threads only add sync cost (badly so on a loaded machine).
    A file opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
