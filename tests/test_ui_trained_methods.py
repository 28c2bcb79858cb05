"""The trained methods on the page (Medusa heads, EAGLE): offered on the live tab and in the race only
when the loaded pair's target has its file (engine/trained/store.py find), and their note says what the
file's report says (measured acceptance, or teacher-forced agreement named as such), or the command
that trains one. A tiny random target, no real pair."""
from types import SimpleNamespace

import pytest
from helpers import fake_pair

from specviz.engine.trained import store
from specviz.ui import method_options as mo
from specviz.ui import speedup_box, trained
from specviz.ui.handlers import Handlers

TRAINED_ON = "Trained on 400k tokens of ShareGPT chat and stdlib code"


@pytest.fixture(autouse=True)
def places(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "SHIPPED", tmp_path / "shipped")


def pair_of(model, tok, name="default"):
    return fake_pair(target=model, draft=None, tokenizer=tok, eos_ids=[0], device=model.device,
                     spec=SimpleNamespace(name=name, target="tiny", draft="tiny-draft"))


def only(kinds, monkeypatch):
    monkeypatch.setattr(store, "find", lambda pair, kind: f"/x/{kind}.pt" if kind in kinds else None)


def values(choices) -> list[str]:
    return [v for _, v in choices]


def page_handlers(pair) -> SimpleNamespace:
    """Handlers' own methods on a stand-in with only the loaded pair (no model manager, no page)."""
    h = SimpleNamespace(manager=SimpleNamespace(pair=pair))
    h.trained_methods = lambda: Handlers.trained_methods(h)
    return h


def test_eagle_offered_only_when_its_file_is_found(target, tok, monkeypatch):
    h = page_handlers(pair_of(target, tok))
    only((), monkeypatch)
    assert not {"eagle", "heads"} & set(values(Handlers.method_choices(h)))
    only(("eagle",), monkeypatch)
    assert trained.found(h.manager.pair) == {"eagle", "eagle-tree"}  # the tree grows from the same head
    offered = values(Handlers.method_choices(h))
    assert {"eagle", "eagle-tree"} <= set(offered) and "heads" not in offered
    only(("eagle", "medusa"), monkeypatch)
    assert {"eagle", "heads"} <= set(values(Handlers.method_choices(h)))


def test_a_failing_lookup_or_no_pair_offers_neither(target, tok, monkeypatch):
    def broken(pair, kind):
        raise OSError("unreadable")
    monkeypatch.setattr(store, "find", broken)
    assert Handlers.trained_methods(page_handlers(pair_of(target, tok))) == frozenset()
    assert Handlers.trained_methods(page_handlers(None)) == frozenset()
    assert not {"eagle", "heads"} & set(values(mo.method_choices()))


def test_note_says_the_reports_acceptance(target, tok):
    pair = pair_of(target, tok)
    rep = {"pass_tokens": 400_000, "held_out_first_draft_agreement": {"chat": 0.55, "code": 0.6, "rows": 9},
           "acceptance_by_position": {"chat": [0.62, 0.4], "code": [0.71, 0.5], "completion": [0.66]},
           "trained_on": TRAINED_ON}
    store.save(pair, "eagle", {"x": 1}, rep, ship=True)
    note = mo.note_html("eagle", pair)
    assert TRAINED_ON in note and "shipped with the app" in note
    assert "first-draft acceptance: chat 0.62, code 0.71, code completion 0.66" in note and "teacher-forced" not in note
    shown, *_ = mo.on_method("eagle", pair)
    assert shown["visible"] and "chat 0.62, code 0.71" in shown["value"]


def test_teacher_forced_agreement_is_named_so(target, tok):
    pair = pair_of(target, tok)
    store.save(pair, "eagle", {"x": 1}, {"pass_tokens": 400_000,
                                         "held_out_first_draft_agreement": {"chat": 0.62, "code": 0.71}})
    note = mo.note_html("eagle", pair)
    assert "trained on this server" in note and "400k tokens" in note
    assert "teacher-forced agreement" in note and "chat 0.62, code 0.71" in note
    assert "first-draft acceptance" not in note


@pytest.mark.parametrize("method, step", [("eagle", "eagle"), ("heads", "medusa")])
def test_no_file_names_the_training_command(target, tok, method, step):
    note = mo.note_html(method, pair_of(target, tok))
    assert f"python -m specviz heads data &amp;&amp; python -m specviz heads {step}" in note
    other = mo.note_html(method, pair_of(target, tok, name="small"))
    assert f"heads data --pair small &amp;&amp; python -m specviz heads {step} --pair small" in other
    assert "heads data" not in mo.note_html("draft", pair_of(target, tok))


def test_race_offers_eagle_when_trained():
    from specviz.ui import leaderboard as board_ui
    assert not {"eagle", "heads"} & set(board_ui.offered()) and board_ui.OFFERED == board_ui.offered()
    assert "eagle" in board_ui.offered({"eagle"}) and "heads" not in board_ui.offered({"eagle"})
    assert {"eagle", "heads"} <= set(values(board_ui.methods_update({"eagle", "heads"}).choices))


def test_speedup_box_says_why_eagle_drafts_under_gamma():
    why = speedup_box._gamma_why(3.5, {"gamma": 4, "method": "eagle"})
    assert "round 1 drafts nothing" in why and "at most K" not in why
    assert "at most K" in speedup_box._gamma_why(2.0, {"gamma": 4, "method": "heads"})


def test_early_exit_says_nothing_of_its_exit_before_a_pair_loads():
    """While the models load, the page knows of no trained exit: early exit's note must not claim there is
    none (the browser showed "No trained exit" beside the ticked box until the load ended)."""
    note = mo.note_html("early-exit", None)
    assert "No trained exit" not in note and "heads exit" not in note and "When it tends to lose" in note
