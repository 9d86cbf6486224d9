"""One-process runs of each framework (no torchrun) take requests filed while they train; what an integration
cannot apply is rejected with the reason, never left unanswered. A Hugging Face Trainer on one process skips
exactly the batches asked, without the Trainer given to the callback rejects a rewind, and after a rewind loads
no checkpoint of the branch it abandoned; a Lightning fit on one process skips exactly the batches asked, with
and without loader worker processes."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def fits() -> ModuleType:
    """The framework code, imported when a test here runs (``one_process_fits``)."""
    import one_process_fits

    return one_process_fits


def test_a_one_process_trainer_skips_exactly_the_batches_asked_and_without_the_trainer_rejects_a_rewind(
    tmp_path, fits
) -> None:
    run = tmp_path / "run"
    requests = {1: {"skip": ("skip", {"first_batch": 3, "last_batch": 3}), "rewind": ("rewind", {"to_step": 0})}}
    trainer, filing, data = fits.one_process_trainer(tmp_path, requests, max_steps=4)
    trainer.add_callback(fits.bedside_callback(run))
    trainer.train()
    answers = {name: fits.acks(run, request_id)[-1] for name, request_id in filing.ids.items()}
    assert (answers["skip"]["status"], answers["skip"]["args"]["sample_ids"]) == ("applied", [12, 13, 14, 15])
    assert data.read[:16] == [*range(12), *range(16, 20)] and not {12, 13, 14, 15} & set(data.read)  # read ahead
    assert (answers["rewind"]["status"], answers["rewind"]["step"]) == ("rejected", 1)
    assert answers["rewind"]["message"] == (
        "rewind needs the Trainer: make the callback with BedsideCallback(run_dir, trainer=trainer)"
    )


def test_a_second_rewind_loads_no_checkpoint_of_the_branch_the_first_abandoned(tmp_path, fits) -> None:
    run = tmp_path / "run"
    requests = {
        5: {"save": ("checkpoint", {})},  # checkpoint-5, on the branch the next rewind abandons
        6: {"first": ("rewind", {"to_step": 3})},  # to checkpoint-2
        7: {"second": ("rewind", {"to_step": 5})},  # after step 7 of the new branch: to checkpoint-4, saved again
    }
    trainer, filing, _ = fits.one_process_trainer(tmp_path, requests, max_steps=9, save_steps=2)
    trainer.add_callback(fits.bedside_callback(run, trainer))
    trainer.train()
    answers = {name: fits.acks(run, request_id)[-1] for name, request_id in filing.ids.items()}
    assert answers["save"]["message"].endswith("checkpoint-5")
    assert [(answers[n]["status"], answers[n]["step"], answers[n]["timeline"]) for n in ("first", "second")] == [
        ("applied", 2, 1),
        ("applied", 4, 2),
    ]
    assert (
        answers["second"]["message"] == "rewound to the checkpoint of step 4 (checkpoint-4); continuing on timeline 2"
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_a_one_process_fit_skips_exactly_the_batches_asked_with_or_without_loader_workers(
    tmp_path, workers, fits
) -> None:
    seen = fits.fit(tmp_path / "run", workers)
    assert (seen["skip"]["status"], seen["skip"]["args"]["sample_ids"]) == ("applied", list(range(12, 20)))
    if not workers:  # a worker process reads the samples in its own copy of the dataset
        assert seen["read"] == [*range(12), *range(20, 32)]
