"""The unlikelihood term on repeats (models/training/unlikelihood.py): which tokens it penalises, that
its value is the sum it says, and that training with it lowers what it penalises."""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from test_training import run

from models.checkpoint import load_checkpoint
from models.data.synthetic import make_pairs
from models.training.data_loading import collate, encode_pairs
from models.training.train import load_train_config
from models.training.unlikelihood import repeat_candidates, stutter_candidates, unlikelihood_loss

PAD = 0


def ends_with_a_run_twice(seq: list[int], n: int) -> bool:
    """An independent definition of a stutter: the sequence ends with some m <= n tokens twice in a row."""
    return any(len(seq) >= 2 * m and seq[-m:] == seq[-2 * m:-m] for m in range(1, n + 1))


def repeats_an_ngram(seq: list[int], n: int) -> bool:
    """An independent definition of a repeat: the sequence's last n tokens occur earlier in it."""
    return len(seq) >= n and any(seq[i:i + n] == seq[-n:] for i in range(len(seq) - n))


def test_candidates_are_the_tokens_that_would_stutter_except_the_reference_own():
    t = torch.tensor([[5, 6, 5, 6, 7, 2, PAD, PAD], [9, 9, 4, 2, PAD, PAD, PAD, PAD]])
    pos, tok = repeat_candidates(t, PAD, 4)
    # "5 6 5 6": after it, 6 repeats the last token and 5 repeats "6 5"; "9 9" is the reference's own repeat
    assert list(zip(pos, tok)) == [(1, 5), (2, 6), (3, 5), (4, 5), (4, 6), (5, 7), (10, 9), (11, 4)]
    rng = random.Random(0)
    for _ in range(30):
        rows = [[rng.randint(3, 6) for _ in range(rng.randint(1, 12))] + [2] for _ in range(3)]
        width = max(map(len, rows))
        batch = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
        got = set(zip(*repeat_candidates(batch, PAD, 3)))
        want = {(b * width + t, v) for b, r in enumerate(rows) for t in range(len(r)) for v in range(3, 7)
                if v != r[t] and ends_with_a_run_twice(r[:t] + [v], 3)}
        assert got == want
        # with n-grams: also every token that completes a trigram the prefix already holds
        got = set(zip(*repeat_candidates(batch, PAD, 3, ngram=3)))
        want = {(b * width + t, v) for b, r in enumerate(rows) for t in range(len(r)) for v in range(3, 7)
                if v != r[t] and (ends_with_a_run_twice(r[:t] + [v], 3) or repeats_an_ngram(r[:t] + [v], 3))}
        assert got == want


def test_tensor_candidates_equal_the_python_search_on_random_batches():
    """stutter_candidates (what training runs) against repeat_candidates (the per-position search): the
    same (position, token) set, each pair once, on random padded batches with many repeats; the loss
    of either search is the explicit sum over its candidates."""
    rng = random.Random(1)
    for trial in range(60):
        n = (1, 2, 3, 5, 12)[trial % 5]
        rows = [[rng.randint(3, 5 + trial % 4) for _ in range(rng.randint(1, 30))] + [2] for _ in range(4)]
        width = max(map(len, rows)) + rng.randint(0, 3)
        batch = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
        tokens, mask = stutter_candidates(batch, PAD, n)
        got = [(p // n, int(v)) for p, v in zip(mask.reshape(-1).nonzero().squeeze(1).tolist(),
                                                 tokens.reshape(-1)[mask.reshape(-1)])]
        assert len(got) == len(set(got))
        assert set(got) == set(zip(*repeat_candidates(batch, PAD, n)))
        logits = torch.randn(*batch.shape, 10)
        want = sum((-torch.log(1 - F.softmax(logits.view(-1, 10)[p], -1)[v])
                    for p, v in zip(*repeat_candidates(batch, PAD, n))), torch.tensor(0.0))
        torch.testing.assert_close(unlikelihood_loss(logits, batch, PAD, n), want)
        # with n-grams (the per-position search): the same sum over its candidates
        want = sum((-torch.log(1 - F.softmax(logits.view(-1, 10)[p], -1)[v])
                    for p, v in zip(*repeat_candidates(batch, PAD, n, ngram=3))), torch.tensor(0.0))
        torch.testing.assert_close(unlikelihood_loss(logits, batch, PAD, n, ngram=3), want)


def test_loss_is_the_sum_of_minus_log_one_minus_p_over_the_candidates():
    torch.manual_seed(0)
    t = torch.tensor([[5, 6, 5, 6, 7, 2, PAD, PAD], [9, 9, 4, 2, PAD, PAD, PAD, PAD]])
    logits = torch.randn(2, 8, 12)
    want = sum(-torch.log(1 - F.softmax(logits.view(-1, 12)[p], -1)[v])
               for p, v in zip(*repeat_candidates(t, PAD, 4)))
    torch.testing.assert_close(unlikelihood_loss(logits, t, PAD, 4), want)
    # "5 5": the only stutter is the reference's own
    assert float(unlikelihood_loss(logits[:1, :2], torch.tensor([[5, 5]]), PAD, 4)) == 0.0


def test_shared_log_softmax_gives_the_same_losses_and_gradients():
    """Training with unlikelihood takes one log-softmax for both terms (models/training/train.py): the
    cross-entropy from it (`smoothed_nll`) equals F.cross_entropy with pads ignored and label smoothing, the
    unlikelihood term from log-probabilities equals the one from logits, and so do the gradients."""
    from models.training.train import smoothed_nll
    rng = random.Random(2)
    for trial in range(12):
        n, smoothing = (1, 4, 12)[trial % 3], (0.0, 0.1)[trial % 2]
        rows = [[rng.randint(3, 6) for _ in range(rng.randint(1, 20))] + [2] for _ in range(3)]
        width = max(map(len, rows)) + 1
        batch = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
        logits = torch.randn(batch.numel(), 9)
        grads = []
        for shared in (False, True):
            x = logits.clone().requires_grad_()
            if shared:
                logp = F.log_softmax(x, -1)
                loss = smoothed_nll(logp, batch.view(-1), PAD, smoothing) \
                    + unlikelihood_loss(logp, batch, PAD, n, log_probs=True)
            else:
                loss = F.cross_entropy(x, batch.view(-1), ignore_index=PAD, label_smoothing=smoothing,
                                       reduction="sum") + unlikelihood_loss(x, batch, PAD, n)
            loss.backward()
            grads.append((loss.detach(), x.grad))
        torch.testing.assert_close(grads[1][0], grads[0][0])
        torch.testing.assert_close(grads[1][1], grads[0][1])
        # with n-grams too (the per-position search)
        logp = F.log_softmax(logits, -1)
        torch.testing.assert_close(unlikelihood_loss(logp, batch, PAD, n, ngram=3, log_probs=True),
                                   unlikelihood_loss(logits, batch, PAD, n, ngram=3))


def one_batch(tok, pairs, cfg):
    """`pairs` encoded and collated as training collates them, all in one batch, on the CPU."""
    examples = encode_pairs(pairs, tok, cfg.max_positions)
    return collate(examples, list(range(len(examples))), cfg.pad_id, cfg.bos_id, cfg.eos_id, torch.device("cpu"))


def log_probs(model, batch) -> torch.Tensor:
    """(B, T, V) next-token log-probabilities of a GMA `model` at its own δ under teacher forcing."""
    src, src_len, tgt_in, _ = batch
    with torch.no_grad():
        logits = model.eval()(src, src_len, tgt_in, None, torch.full((src.shape[0],), model.cfg.default_delta))
    return F.log_softmax(logits.float(), -1)


def candidate_probability(model, tok, pairs) -> float:
    """Mean probability the model gives the stutter candidates of `pairs` under teacher forcing."""
    batch = one_batch(tok, pairs, model.cfg)
    logp = log_probs(model, batch)
    pos, tokens = repeat_candidates(batch[3], model.cfg.pad_id, 12)
    return float(logp.reshape(-1, logp.shape[-1])[torch.tensor(pos), torch.tensor(tokens)].exp().mean())


def test_training_with_the_term_lowers_the_probability_of_stutters(word_tok, tmp_path):
    held_out = make_pairs(40, seed=7)
    probs = {}
    for weight in (0.0, 2.0):
        run(word_tok, tmp_path / str(weight), "gma", max_steps=40, max_epochs=10, unlikelihood=weight)
        model, _, _ = load_checkpoint(tmp_path / str(weight) / "checkpoint")
        probs[weight] = candidate_probability(model, word_tok, held_out)
    assert probs[2.0] < 0.7 * probs[0.0]


def test_recipes_take_the_weight(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output: x\nmodel: {}\nunlikelihood: 0.5\nunlikelihood_stutter: 4\nunlikelihood_ngram: 3\n")
    tc = load_train_config(recipe, cuda_available=False)
    assert (tc.unlikelihood, tc.unlikelihood_stutter, tc.unlikelihood_ngram) == (0.5, 4, 3)


def divergence(model, start, tok, pairs) -> float:
    """Mean KL(start || model) per target token of `pairs` under teacher forcing."""
    batch = one_batch(tok, pairs, model.cfg)
    p, q = log_probs(start, batch), log_probs(model, batch)
    keep = batch[3] != model.cfg.pad_id
    return float((p.exp() * (p - q)).sum(-1)[keep].mean())


def test_distillation_from_the_start_holds_the_model_where_it_was(word_tok, tmp_path):
    """teacher = the starting weights: 30 updates of distillation change the model's predictions on
    held-out pairs far less than 30 of cross-entropy on the same batches do."""
    run(word_tok, tmp_path / "start", "gma", max_steps=40, max_epochs=10)
    start_dir = str(tmp_path / "start" / "checkpoint")
    start = load_checkpoint(start_dir)[0]
    held_out = make_pairs(40, seed=7)
    moved = {}
    for name, extra in (("ce", {}), ("kd", {"teacher": start_dir, "teacher_weight": 1.0})):
        trainer, _ = run(word_tok, tmp_path / name, "gma", max_steps=30, max_epochs=10, init_from=start_dir,
                         **extra)
        moved[name] = divergence(trainer.model, start, word_tok, held_out)
    assert moved["kd"] < 0.25 * moved["ce"]


def test_distillation_loss_is_the_kl_to_the_teacher(word_tok, tmp_path):
    from models.training.train import batch_loss
    run(word_tok, tmp_path / "t", "gma", max_steps=20, max_epochs=10)
    teacher = load_checkpoint(tmp_path / "t" / "checkpoint")[0]
    torch.manual_seed(1)
    student = load_checkpoint(tmp_path / "t" / "checkpoint")[0]
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = student.cfg
    batch = one_batch(word_tok, make_pairs(6, seed=3), cfg)
    with torch.no_grad():
        kd, n = batch_loss(student, batch, cfg, None, 0.1, None, teacher=teacher, teacher_weight=1.0)
        ce, _ = batch_loss(student, batch, cfg, None, 0.1, None)
        half, _ = batch_loss(student, batch, cfg, None, 0.1, None, teacher=teacher, teacher_weight=0.5)
    pt, ps = log_probs(teacher, batch), log_probs(student, batch)
    keep = batch[3] != cfg.pad_id
    want = float((pt.exp() * (pt - ps)).sum(-1)[keep].sum())
    assert abs(float(kd) - want) < 1e-3 * max(1.0, want) and want > 0
    assert abs(float(half) - 0.5 * (float(kd) + float(ce))) < 1e-3 * float(ce)
    # the teacher against itself: nothing to learn
    with torch.no_grad():
        same, _ = batch_loss(teacher, batch, cfg, None, 0.1, None, teacher=teacher, teacher_weight=1.0)
    assert abs(float(same)) < 1e-4 * n


def test_a_teacher_or_start_with_another_vocabulary_is_a_clear_error(word_tok, piece_tok, tmp_path):
    """Distillation and init_from need the data's vocabulary; one of the same size with other pieces at the
    same ids (which the old size check let through) is refused, and so is a copy trained from another path."""
    import pytest
    from models.data.synthetic import make_tokenizer
    from models.errors import UserError
    from models.training.train import load_teacher
    run(word_tok, tmp_path / "t", "gma", max_steps=5, max_epochs=10)
    start = str(tmp_path / "t" / "checkpoint")
    same_size = make_tokenizer(tmp_path / "upper", "word",
                               pairs=[(s.title(), t.title()) for s, t in make_pairs(2000, seed=123)])
    assert same_size.vocab_size == word_tok.vocab_size
    for tok, why in ((piece_tok, r"\d+ pieces against \d+"), (same_size, r"piece \d+ is ")):
        with pytest.raises(UserError, match=f"another vocabulary than the data's spm.model \\({why}"):
            load_teacher(start, tok, torch.device("cpu"))
        with pytest.raises(UserError, match=f"init_from .* another vocabulary .*\\({why}.*--vocab-from"):
            run(tok, tmp_path / "other", "gma", max_steps=1, max_epochs=1, init_from=start)
    alike = make_tokenizer(tmp_path / "alike", "word")   # the same training as word_tok, from another path
    assert alike.proto != word_tok.proto
    assert load_teacher(start, alike, torch.device("cpu")) is not None


def test_train_only_trains_the_matching_parameters_and_nothing_else(word_tok, tmp_path):
    import pytest
    from models.errors import UserError
    run(word_tok, tmp_path / "start", "gma", max_steps=10, max_epochs=10)
    start_dir = str(tmp_path / "start" / "checkpoint")
    start = load_checkpoint(start_dir)[0].state_dict()
    trainer, _ = run(word_tok, tmp_path / "part", "gma", max_steps=10, max_epochs=10, init_from=start_dir,
                     train_only=["decoder.1.ffn.*", "decoder.1.ln3.*"], unlikelihood=1.0)
    after = trainer.model.state_dict()
    for name in start:
        same = torch.equal(after[name].float(), start[name].float())
        assert same != (name.startswith(("decoder.1.ffn.", "decoder.1.ln3."))), name
    with pytest.raises(UserError, match="matches no parameter"):
        run(word_tok, tmp_path / "none", "gma", max_steps=1, max_epochs=10, train_only=["nothing.*"])


def test_bad_settings_are_clear_errors(word_tok, tmp_path):
    import pytest
    from models.errors import UserError
    for bad, message in (({"unlikelihood": -1.0}, "unlikelihood must be"),
                         ({"unlikelihood_stutter": 40}, "unlikelihood_stutter must be"),
                         ({"unlikelihood_ngram": 2.5}, "unlikelihood_ngram must be"),
                         ({"teacher_weight": 1.5}, "teacher_weight must be")):
        with pytest.raises(UserError, match=message):
            run(word_tok, tmp_path / "x", "gma", max_steps=1, max_epochs=1, **bad)
