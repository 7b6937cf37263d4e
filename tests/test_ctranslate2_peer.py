"""The offline model checked against an independent implementation: CTranslate2 (the [peer] extra).

The shipped offline checkpoint, converted weight for weight (models/ctranslate2_peer.py), must
translate greedily to the very same subword ids in float32 as the project's own decoding loop
(StreamingDecoder through `simulate`, as `simulserve translate -m offline --offline`). Any
difference in the layers, masks, positions, scaling, tied output or length cap would show here.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("ctranslate2")

from models.checkpoint import load_checkpoint, read_config, save_checkpoint  # noqa: E402
from models.ctranslate2_peer import CTranslate2Peer, PeerError, convert, unmappable_reason  # noqa: E402
from models.shipped import shipped_checkpoints  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.translate import simulate  # noqa: E402

# everyday German of every length from 2 to 30-odd words: questions, numbers, commas, compounds
SENTENCES = [
    "Guten Morgen!",
    "Wie geht es dir?",
    "Der Zug hat zehn Minuten Verspätung.",
    "Ich möchte gern einen Kaffee mit Milch, bitte.",
    "Wo ist der nächste Bahnhof?",
    "Kannst du mir morgen beim Umzug helfen?",
    "Das Wetter ist heute sehr schön, aber morgen soll es regnen.",
    "Wir treffen uns um acht Uhr vor dem Kino.",
    "Entschuldigung, wie spät ist es?",
    "Meine Schwester wohnt seit drei Jahren in Hamburg.",
    "Die Rechnung, bitte.",
    "Hast du schon gegessen?",
    "Ich habe meinen Schlüssel im Büro vergessen.",
    "Der Arzt hat gesagt, dass ich mich ausruhen soll.",
    "Könnten Sie bitte etwas langsamer sprechen?",
    "Am Wochenende fahren wir mit den Kindern ans Meer.",
    "Das Geschäft öffnet erst um neun Uhr.",
    "Ich suche eine Wohnung mit zwei Zimmern und einem Balkon.",
    "Vielen Dank für deine Hilfe!",
    "Der Bus fährt alle zwanzig Minuten.",
    "Ich verstehe nicht, was du meinst.",
    "Wir haben im Restaurant einen Tisch für vier Personen reserviert.",
    "Mein Handy ist kaputt, deshalb konnte ich dich nicht anrufen.",
    "Bitte schließen Sie die Tür.",
    "Wann beginnt der Deutschkurs?",
    "Er arbeitet als Lehrer an einer Grundschule.",
    "Kinder unter sechs Jahren fahren kostenlos.",
    "Ich bin müde und gehe jetzt ins Bett.",
    "Das Paket wurde gestern an die falsche Adresse geliefert.",
    "Können wir den Termin auf nächsten Dienstag verschieben?",
    "Im Sommer ist es hier oft sehr heiß.",
    "Sie hat ihren Geburtstag mit vielen Freunden gefeiert.",
    "Die Apotheke ist gleich neben der Post.",
    "Ich trinke morgens immer einen Tee.",
    "Weil es so stark geregnet hat, sind wir zu Hause geblieben und haben den ganzen Nachmittag "
    "Karten gespielt, bis unsere Nachbarn zum Abendessen gekommen sind.",
    "Wie viel kostet eine Fahrkarte nach München?",
    "Ja.",
    "Nein, danke, ich brauche keine Tüte.",
    "Unser Flugzeug landet um 14:35 Uhr in Frankfurt.",
    "Der Kühlschrank ist leer, wir müssen einkaufen gehen.",
]


def project_ids(decoder, sentences, batch_size):
    ids = []
    simulate(decoder, sentences, whole_sentence=True, batch_size=batch_size, tokens_out=ids)
    assert all(x[-1] == decoder.cfg.eos_id for x in ids)
    return [x[:-1] for x in ids]


def test_shipped_offline_model_is_token_identical_in_ctranslate2(tmp_path, one_torch_thread):
    out = convert("offline", tmp_path / "ct2")
    model, tok, _ = load_checkpoint(shipped_checkpoints()["offline"])
    ours = project_ids(StreamingDecoder(model, tok), SENTENCES, batch_size=8)
    assert min(map(len, ours)) >= 1 and sum(map(len, ours)) > 4 * len(SENTENCES)   # real translations
    peer = CTranslate2Peer(out, tok, model.cfg, "float32", threads=1)
    for batch_size in (1, 8):   # alone, and padded among others
        theirs, texts = peer.translate(SENTENCES, batch_size)
        diff = [(s, tok.decode(a), t) for s, a, b, t in zip(SENTENCES, ours, theirs, texts) if a != b]
        assert not diff, f"batch {batch_size}: {len(diff)} outputs differ, e.g. {diff[:3]}"
    # one embedding for input, both sides and output: stored once (~7.6 M float32 weights, not 9.6 M)
    assert (out / "model.bin").stat().st_size < 32e6


def test_length_cap_and_a_second_configuration_map_too(tmp_path, piece_tok, one_torch_thread):
    """An untrained offline model of another shape (2 layers, d=32, 48 positions) writes until the
    project's length cap cuts it: the converter reads the shape from the config, and the peer
    cuts where StreamingDecoder does."""
    import torch

    from conftest import tiny_config
    from models.transformer import Transformer
    torch.manual_seed(3)
    model = Transformer(tiny_config(piece_tok, "offline")).eval()
    ckpt = save_checkpoint(tmp_path / "tiny", model, piece_tok, dtype=None)
    out = convert(ckpt, tmp_path / "ct2")
    sentences = ["a b c", "b c d e a", "c", "d a b c e a b"]
    ours = project_ids(StreamingDecoder(model, piece_tok), sentences, batch_size=4)
    peer = CTranslate2Peer(out, piece_tok, model.cfg)
    assert any(len(x) == peer.cap(len(piece_tok.encode(s))) for x, s in zip(ours, sentences)), \
        "no output reached the cap: the test does not exercise it"
    assert peer.translate(sentences, 4)[0] == ours


@pytest.mark.parametrize("name", ["waitk", "gma_delta1"])
def test_streaming_models_are_refused_with_the_reason(name, tmp_path):
    cfg, _ = read_config(shipped_checkpoints()[name])
    assert cfg.causal_encoder and "causal" in unmappable_reason(cfg)
    assert ("t + k" if name == "waitk" else "Gaussian") in unmappable_reason(cfg)
    with pytest.raises(PeerError, match="cannot be converted"):
        convert(name, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_bench_peer_reports_identical_outputs_at_both_precisions(tmp_path, capsys):
    from clients.cli import main
    src = tmp_path / "s.de"
    src.write_text("\n".join(SENTENCES[:6]) + "\n", encoding="utf-8")
    rc = main(["bench", "peer", "--source", str(src), "--batch-sizes", "1,3", "--json", str(tmp_path / "r.json")])
    assert rc == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [(r["precision"], r["batch_size"]) for r in rows] == \
        [("float32", 1), ("float32", 3), ("int8", 1), ("int8", 3)]
    for r in rows:
        assert r["ctranslate2_tokens_per_s"] > 0
        assert r["simulserve_tokens_per_s"] > 0
        if r["precision"] == "float32":
            assert r["identical"] == r["identical_to_float32"] == 6
        else:   # both engines quantise, each its own way: outputs may differ, and are counted
            assert 0 <= r["identical"] <= 6 and 0 <= r["identical_to_float32"] <= 6
    out = capsys.readouterr().out
    assert "n/a" not in out
    # int8 over float32 per batch size, from the same run's rows (the precisions take turns in each round)
    by = {(r["precision"], r["batch_size"]): r for r in rows}
    line = next(x for x in out.splitlines() if x.startswith("int8 over float32 in this run"))
    for b in (1, 3):
        ours = by["int8", b]["simulserve_tokens_per_cpu_s"] / by["float32", b]["simulserve_tokens_per_cpu_s"]
        theirs = by["int8", b]["ctranslate2_tokens_per_cpu_s"] / by["float32", b]["ctranslate2_tokens_per_cpu_s"]
        assert f"batch {b}: simulserve {ours:.2f}x, CTranslate2 {theirs:.2f}x" in line
