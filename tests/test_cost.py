"""Measured cost (qac.tracking.cost, qac.reporting.measured_cost): what a stage's run records of its work, the
readers of the energy counters, and the sums per stage and per table cell that `qac runs cost` prints."""

import json
import time
from pathlib import Path

import mlflow
import pytest

from qac.params import validate_params
from qac.tracking.cost import CostMeter, NvmlCounter, RaplCounter, rapl_zones
from qac.tracking.lifecycle import tracked_stage

PARAMS = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)


def zone(root: Path, folder: str, name: str, energy: int, max_range: int = 1000) -> Path:
    path = root / folder
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range}\n")
    return path


def test_rapl_counts_packages_and_dram_once_and_adds_back_a_wrapped_counter(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 900)
    zone(tmp_path, "intel-rapl:0:0", "core", 5)            # inside the package's figure
    dram = zone(tmp_path, "intel-rapl:0:2", "dram", 10, max_range=100)
    zone(tmp_path, "intel-rapl:1", "psys", 7)               # spans the packages
    zone(tmp_path, "intel-rapl-mmio:0", "package-0", 900)   # the package's counter again
    zones, why = rapl_zones(tmp_path)
    assert why is None and sorted(z.name for z in zones) == ["dram", "package-0"]
    counter = RaplCounter(zones)
    (package / "energy_uj").write_text("950\n")
    (dram / "energy_uj").write_text("30\n")
    counter.sample()                                        # 50 + 20
    (package / "energy_uj").write_text("100\n")             # wrapped at 1000: 950 -> 1000 -> 0 -> 100
    (dram / "energy_uj").write_text("5\n")                  # wrapped at 100: 30 -> 100 -> 0 -> 5
    counter.sample()                                        # 150 + 75
    assert counter.microjoules == 50 + 20 + 150 + 75


def test_unreadable_rapl_counters_are_said_not_readable(tmp_path):
    assert rapl_zones(tmp_path / "absent") == ([], f"not readable: no {tmp_path / 'absent'}")
    locked = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (locked / "energy_uj").unlink()
    (locked / "energy_uj").mkdir()        # reading it fails as a root-only file fails for a user, even for root
    zones, why = rapl_zones(tmp_path)
    assert zones == [] and why.startswith("not readable: intel-rapl:0 unreadable")


class FakeNvml:
    """pynvml's calls the reader makes, on GPUs whose millijoule counters the test sets."""

    def __init__(self, energies: dict[int, int]):
        self.energies = energies

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.energies)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energies[handle]


def test_nvml_reads_the_gpus_of_this_nodes_ranks():
    nvml = FakeNvml({0: 1_000, 1: 50_000, 2: 7_000, 3: 9_000})
    counter, note = NvmlCounter.open(nvml, {"CUDA_VISIBLE_DEVICES": "2,3,0", "LOCAL_WORLD_SIZE": "2"})
    assert note == "NVML" and counter.handles == [2, 3]
    nvml.energies.update({2: 9_500, 3: 10_000, 0: 90_000})     # GPU 0 is not this job's
    assert counter.joules() == (pytest.approx((2_500 + 1_000) / 1000), "NVML, 2 GPU(s)")
    del nvml.energies[3]                                        # the GPU fell off the bus: said, not raised
    assert counter.joules() == (None, "not readable: NVML: 3")
    assert NvmlCounter.open(None, {}) == (None, "not readable: pynvml not installed")

    class Unsupported(FakeNvml):
        def nvmlDeviceGetTotalEnergyConsumption(self, handle):
            raise RuntimeError("Not Supported")

    assert NvmlCounter.open(Unsupported({0: 0}), {}) == (None, "not readable: NVML: Not Supported")


def test_the_meter_samples_rapl_while_the_work_runs(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 900)
    with CostMeter(powercap=tmp_path, nvml=None, interval=0.01, environ={}) as meter:
        (package / "energy_uj").write_text("950\n")
        deadline = time.time() + 10
        while meter.rapl.last[package] != 950 and time.time() < deadline:
            time.sleep(0.01)
        (package / "energy_uj").write_text("100\n")        # wrapped: seen by the sample at the end
    assert meter.cost.energy_cpu_j == pytest.approx((50 + 150) / 1e6)
    assert meter.cost.metrics()["cost/energy_j"] == meter.cost.energy_cpu_j
    assert meter.cost.energy == "RAPL package-0; GPU not used"


def test_on_a_gpu_the_meter_reads_cuda_peak_memory_and_nvml_energy(tmp_path, monkeypatch):
    """A process that has initialised CUDA (torch.cuda stood in for: this machine has no GPU)."""
    import sys
    import types

    calls = []
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 reset_peak_memory_stats=lambda: calls.append("reset"),
                                 max_memory_allocated=lambda: 3 * 2**30)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    nvml = FakeNvml({0: 10_000, 1: 20_000})
    environ = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}          # the first of two nodes
    with CostMeter(powercap=tmp_path / "absent", nvml=nvml, environ=environ) as meter:
        nvml.energies.update({0: 70_000, 1: 80_000})
    cost = meter.cost
    assert calls == ["reset"]        # a stage before it in this process does not set its peak
    assert (cost.device, cost.devices, cost.peak_gpu_mb) == ("cuda", 4, 3072)
    assert (cost.energy_gpu_j, cost.energy_cpu_j) == (120, None)
    assert cost.metrics()["cost/energy_j"] == 120
    assert cost.energy == (f"CPU not readable: no {tmp_path / 'absent'}; NVML, 2 GPU(s); "
                           "this node's 2 of 4 ranks only")


def busy_work(seconds: float) -> bytearray:
    """CPU time and 64 MiB of touched memory."""
    block = bytearray(64 * 2**20)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return block


def test_a_stage_run_records_its_cost_and_its_output_holds_none_of_it(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")          # rank 0 of a two-process job
    root = tmp_path / "data" / "smoke"
    output = root / "pretrain" / "x"
    started = time.perf_counter()
    with tracked_stage(PARAMS, "pretrain@x", "pretrain · x", kind="pretrain", output=output, root=root) as tracking:
        busy_work(0.3)
        output.mkdir(parents=True)
        (output / "metrics.json").write_text(json.dumps({"loss": 1.0}))
        tracking.log_metrics({"loss": 1.0})
    wall = time.perf_counter() - started
    run = mlflow.MlflowClient().get_run(tracking.run_id)
    metrics, tags = run.data.metrics, run.data.tags
    assert 0.3 <= metrics["cost/wall_seconds"] <= wall and metrics["cost/devices"] == 2
    assert metrics["cost/device_seconds"] == pytest.approx(2 * metrics["cost/wall_seconds"])
    assert metrics["cost/cpu_seconds"] >= 0.3 and metrics["cost/peak_rss_mb"] >= 64
    assert tags["qac.cost.device"] == "cpu" and "cost/peak_gpu_mb" not in metrics
    # This machine exposes neither counter: said, and no joules invented.
    assert "not readable" in tags["qac.cost.energy"] and "cost/energy_j" not in metrics
    written = [path.read_text() for path in (root).rglob("*") if path.is_file()]
    assert written and not any("cost/" in text or "qac.cost" in text for text in written)


def test_a_failed_stage_records_what_it_cost_and_the_evaluate_stage_none(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data" / "smoke"
    with pytest.raises(RuntimeError):
        with tracked_stage(PARAMS, "finetune@x", "r1 · x", kind="finetune", root=root) as failed:
            busy_work(0.1)
            raise RuntimeError("the work failed")
    with tracked_stage(PARAMS, "evaluate@x", "untuned · x", kind="baseline", root=root) as evaluated:
        evaluated.log_metrics({"eval/seconds": 4.0})
    client = mlflow.MlflowClient()
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.data.metrics["cost/cpu_seconds"] >= 0.1
    assert not [key for key in client.get_run(evaluated.run_id).data.metrics if key.startswith("cost/")]


def log_run(client, experiment, stage, name, *, status="FINISHED", start=0, cost=None, tags=None, metrics=None,
            profile="smoke"):
    """A run as a stage leaves it: its tags, its cost figures (``(device_seconds, devices, energy or None)``)."""
    run = client.create_run(experiment, run_name=name, start_time=start,
                            tags={"qac.stage": stage, "qac.profile": profile, **(tags or {})})
    values = dict(metrics or {})
    if cost is not None:
        device_seconds, devices, energy = cost
        values.update({"cost/wall_seconds": device_seconds / devices, "cost/devices": devices,
                       "cost/device_seconds": device_seconds, "cost/cpu_seconds": device_seconds / 2,
                       "cost/peak_rss_mb": 1000 + device_seconds})
        if energy is not None:
            values["cost/energy_j"] = energy
        client.set_tag(run.info.run_id, "qac.cost.device", "cuda")
    for key, value in values.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


@pytest.fixture
def measured_store(tmp_path, mlflow_store):
    """Profile smoke's runs behind Table 1's coCondenser retriever-1 cell (two seeds), with an older rerun, a
    killed run the latest resumed, one it replaced, and another profile's run."""
    client = mlflow.MlflowClient(mlflow_store)
    experiment = client.create_experiment("qac-smoke")
    v, seed = "cocondenser-passage", "cocondenser-passage-seed43"
    log_run(client, experiment, f"pretrain@{v}", "pretrain · v", start=1, cost=(999, 1, 1.0))     # older rerun
    killed = log_run(client, experiment, f"pretrain@{v}", "pretrain · v", status="KILLED", start=2, cost=(40, 4, None))
    log_run(client, experiment, f"pretrain@{v}", "pretrain · v", status="KILLED", start=2, cost=(777, 4, 7.0))
    log_run(client, experiment, f"pretrain@{v}", "pretrain · v", start=3, cost=(360, 4, 500.0),
            tags={"qac.resumes_run": killed, "qac.replaces_run": "the other killed one"})
    log_run(client, experiment, f"pretrain@{seed}", "pretrain · seed", start=3, cost=(400, 4, 600.0))
    for variant in (v, seed):
        for retriever, seconds in (("r1", 100), ("r2", 200)):
            log_run(client, experiment, f"finetune@{variant}", f"{retriever} · {variant}", start=4,
                    cost=(seconds, 1, None), tags={"qac.eval.stage": f"evaluate@{variant}", "qac.variant": variant},
                    metrics={"eval/seconds": 10})
    log_run(client, experiment, f"evaluate@{v}", "untuned · v", start=5, tags={"qac.variant": v},
            metrics={"eval/seconds": 5})
    log_run(client, experiment, "generate_queries", "generate_queries", start=1, cost=(50, 1, 20.0))
    log_run(client, experiment, "split_passages", "split_passages", start=1)              # before costs were logged
    log_run(client, experiment, f"pretrain@{v}", "pretrain · v", start=9, cost=(5000, 8, None), profile="paper")
    return client


def test_the_cost_report_sums_each_stage_and_each_cell_of_the_profile(measured_store, monkeypatch, tmp_path, capsys):
    from qac.cli import main
    from qac.config import render_profile
    from qac.reporting.measured_cost import measured_cost

    cost = measured_cost(validate_params(render_profile("smoke")), measured_store, "the store")
    v, seed = "cocondenser-passage", "cocondenser-passage-seed43"
    pretrain = cost.stages[f"pretrain@{v}"]          # the latest and the killed run it resumed: 360 + 40
    assert (pretrain.runs, pretrain.device_seconds, pretrain.energy_j, pretrain.energy_runs) == (2, 400, 500, 1)
    assert pretrain.row()["energy J"] == "500 (1 of 2 runs)" and pretrain.peak_rss_mb == 1360
    assert cost.stages[f"finetune@{v}"].device_seconds == 300
    assert cost.stages[f"evaluate@{v}"].device_seconds == 10 + 10 + 5
    assert cost.stages["split_passages"].row()["runs"] == "1 (1 unmeasured)"
    # Table 1's coCondenser retriever 1: both seeds' pre-training, fine-tuning (r1 and r2) and evaluation.
    row = next(row for row in cost.cells if row["row"] == "coCondenser 120k retriever1 (repro)")
    assert row["cells"] == "mrr@10, r@50" and row["run"] == f"{v} r1"
    assert row["device s"] == f"{400 + 400 + 300 + 300 + 25 + 20:,.1f}" and row["energy J"] == "1,100 (2 of 7 runs)"
    assert row["peak RSS MB"] == "1,400" and row["runs"] == "8"     # 3 pre-trainings, 4 fine-tunings, untuned
    assert next(row for row in cost.cells if row["row"] == "coCondenser q=1")["runs"] == "no runs"

    monkeypatch.chdir(tmp_path)
    assert main(["runs", "cost", "smoke"]) == 0
    report = (tmp_path / "reports" / "cost" / "smoke.md").read_text()
    assert report in capsys.readouterr().out
    assert f"| pretrain@{v} | 2 | cuda | 0.111 | 400.0 |" in report and "paper" not in report.split("## Per stage")[1]
    assert not list((tmp_path / "reports" / "cost").glob(".*"))      # written whole, no staging file left
    assert main(["runs", "cost", "smoke", "--out", "reports"]) == 2          # a folder is never replaced
    assert (tmp_path / "reports" / "cost" / "smoke.md").read_text() == report


def test_the_plan_prints_the_measured_hours_beside_the_projection(measured_store, capsys):
    from qac.cli import main

    assert main(["profile", "plan", "smoke", "--cost"]) == 0
    out = capsys.readouterr().out
    pretrain = next(line for line in out.splitlines() if line.startswith("| pretrain | cocondenser-passage |"))
    assert pretrain.endswith("| 0.111 cuda-h |")
    assert "measured: device-hours" in out and "the MLflow store" in out
