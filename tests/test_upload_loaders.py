"""Each upload loader (a trace for the replay, a race bundle for the race tab) answers a file it
cannot read with one ValueError line, never another exception (issue 51: arrays nested 200,000
deep ended a replay in a RecursionError traceback in the server log, nothing on the page)."""
import pytest

from specviz.run.race_bundle import load_bundle
from specviz.run.trace import load_trace
from specviz.ui.replay import load_for_replay

DEEP = b'{"version": 1, "meta": ' + b"[" * 200_000 + b"]" * 200_000 + b', "events": []}'
BAD = {
    "deep": (DEEP, "nested too deeply"),
    "binary": (bytes(range(256)) * 40, "utf-8"),
    "nan": (b'{"version": 1, "meta": {}, "events": [{"type": "token", "side": "baseline", "t": NaN}]}', "NaN"),
}
NAN_BUNDLE = (b'{"version": 1, "kind": "race-methods", "meta": {}, "keys": [], "baseline": '
              b'[{"type": "token", "side": "baseline", "t": NaN}], "runs": []}')
LOADERS = {"trace": load_trace, "replay": load_for_replay, "bundle": load_bundle}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("kind", BAD)
def test_bad_file_gives_one_line(tmp_path, loader, kind):
    body, words = BAD[kind]
    if kind == "nan" and loader == "bundle":
        body = NAN_BUNDLE
    path = tmp_path / f"{kind}.json"
    path.write_bytes(body)
    with pytest.raises(ValueError) as err:
        LOADERS[loader](path)
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert words.lower() in msg.lower() or (kind == "binary" and "not text" in msg), msg
    if loader != "trace":
        assert msg.startswith("not a SpecViz"), msg
