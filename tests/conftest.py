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
