"""What a stage's run cost, measured while its work runs: device-seconds, peak memory and, where readable, energy.

:func:`qac.tracking.lifecycle.tracked_stage` measures the work inside its
``with`` through a :class:`CostMeter` and logs the figures into the stage's
MLflow run however the work ends, so every stage has them without code of its
own. They differ on every run, so they go to MLflow only, never into a DVC
output:

- ``cost/wall_seconds``, ``cost/devices`` (the world size of a torchrun job,
  one device per rank), ``cost/device_seconds`` (their product) and
  ``cost/cpu_seconds`` (user and system time of the tracking process and the
  children it waited for, such as data-loader workers);
- ``cost/peak_rss_mb``: the peak resident set of the tracking process
  (``getrusage``: over the process's life, which a stage's process is) and,
  when the stage used CUDA, ``cost/peak_gpu_mb`` (``max_memory_allocated``);
- ``cost/energy_cpu_j``: the CPU packages' RAPL counters (and their DRAM
  zones), ``/sys/class/powercap/*/energy_uj``, sampled every
  :data:`SAMPLE_SECONDS` so that a counter wrapping at
  ``max_energy_range_uj`` (about every quarter hour under load) is counted
  once per wrap; ``cost/energy_gpu_j``: NVML's energy counters of the GPUs of
  this node's ranks, when ``pynvml`` imports and the stage used CUDA;
  ``cost/energy_j``: the sum of those read (on a job of several nodes, the
  tracking node's only: the tag says so).

The tags ``qac.cost.device`` (``cuda`` or ``cpu``) and ``qac.cost.energy``
say what was read, or why nothing was ("not readable: ..."). A run killed by
SIGKILL logs none of it.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

POWERCAP = Path("/sys/class/powercap")
SAMPLE_SECONDS = 30.0      # a package at 300 W wraps a 262 kJ counter in about 15 minutes
_ZONE = re.compile(r"^[a-z-]+:\d+(:\d+)?$")
_NOT_IMPORTED = object()


@dataclass
class RaplZone:
    path: Path          # the zone's folder, holding energy_uj
    name: str           # package-0, dram, ...
    max_uj: int         # where the counter wraps to 0


def rapl_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str | None]:
    """The readable package zones (and DRAM zones within them) under ``root``, or why there are none.

    A package's core and uncore zones lie inside its own figure and ``psys`` spans the packages, so
    those are left out; ``*-mmio`` zones repeat a package's counter.
    """
    if not root.is_dir():
        return [], f"not readable: no {root}"
    zones, unreadable = [], []
    for folder in sorted(root.iterdir()):
        if not _ZONE.match(folder.name) or "mmio" in folder.name or not (folder / "energy_uj").exists():
            continue
        try:
            name = (folder / "name").read_text().strip()
            if not (name.startswith("package") or name == "dram"):
                continue
            int((folder / "energy_uj").read_text())
            zones.append(RaplZone(folder, name, int((folder / "max_energy_range_uj").read_text())))
        except (OSError, ValueError):
            unreadable.append(folder.name)
    if not zones:
        why = f"{', '.join(unreadable)} unreadable (root only on most systems)" if unreadable else "no RAPL zone"
        return [], f"not readable: {why} under {root}"
    return zones, None


class RaplCounter:
    """The joules the zones counted since it was made, each wrap of a counter added back at ``sample()``."""

    def __init__(self, zones: list[RaplZone]):
        self.zones = zones
        self.last = {zone.path: self._read(zone) for zone in zones}
        self.microjoules = 0

    @staticmethod
    def _read(zone: RaplZone) -> int | None:
        try:
            return int((zone.path / "energy_uj").read_text())
        except (OSError, ValueError):
            return None

    def sample(self) -> None:
        for zone in self.zones:
            now, last = self._read(zone), self.last[zone.path]
            if now is None:
                continue
            if last is not None:
                self.microjoules += now - last if now >= last else now + zone.max_uj - last
            self.last[zone.path] = now

    @property
    def joules(self) -> float:
        return self.microjoules / 1e6


def _import_pynvml():
    """pynvml, or None: optional on purpose (qac runs without it; only then are GPU joules read)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class NvmlCounter:
    """The joules NVML counted on this node's GPUs since it was made (a 64-bit millijoule counter: no wrap)."""

    def __init__(self, nvml, handles: list):
        self.nvml, self.handles = nvml, handles
        self.start = [nvml.nvmlDeviceGetTotalEnergyConsumption(handle) for handle in handles]

    @classmethod
    def open(cls, nvml, environ: Mapping[str, str]) -> tuple["NvmlCounter | None", str]:
        """The counter of the GPUs this node's ranks use (the first ``LOCAL_WORLD_SIZE`` visible ones), or why not."""
        if nvml is None:
            return None, "not readable: pynvml not installed"
        try:
            nvml.nvmlInit()
            visible = [item for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
            if not visible:
                visible = [str(index) for index in range(nvml.nvmlDeviceGetCount())]
            used = visible[:int(environ.get("LOCAL_WORLD_SIZE", 1))]
            handles = [nvml.nvmlDeviceGetHandleByIndex(int(item)) if item.isdigit()
                       else nvml.nvmlDeviceGetHandleByUUID(item) for item in used]
            return cls(nvml, handles), "NVML"
        except Exception as error:     # NVMLError_NotSupported (before Volta), no driver, ...
            return None, f"not readable: NVML: {error}"

    def joules(self) -> tuple[float | None, str]:
        """The joules since it was made and where they came from, or None and why not (a measurement never
        fails the stage it measures)."""
        try:
            ends = [self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle) for handle in self.handles]
        except Exception as error:
            return None, f"not readable: NVML: {error}"
        return sum(end - start for start, end in zip(self.start, ends)) / 1e3, f"NVML, {len(self.handles)} GPU(s)"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024    # bytes there, KiB on Linux


def _cuda_in_use():
    """torch.cuda when this process has initialised CUDA, else None (torch is not imported here for it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@dataclass
class Cost:
    wall_seconds: float
    devices: int
    device: str
    cpu_seconds: float
    peak_rss_mb: float
    peak_gpu_mb: float | None
    energy_cpu_j: float | None
    energy_gpu_j: float | None
    energy: str         # where the joules came from, or why there are none

    def metrics(self) -> dict[str, float]:
        figures = {"cost/wall_seconds": self.wall_seconds, "cost/devices": self.devices,
                   "cost/device_seconds": self.wall_seconds * self.devices, "cost/cpu_seconds": self.cpu_seconds,
                   "cost/peak_rss_mb": self.peak_rss_mb, "cost/peak_gpu_mb": self.peak_gpu_mb,
                   "cost/energy_cpu_j": self.energy_cpu_j, "cost/energy_gpu_j": self.energy_gpu_j}
        read = [joules for joules in (self.energy_cpu_j, self.energy_gpu_j) if joules is not None]
        if read:
            figures["cost/energy_j"] = sum(read)
        return {key: float(value) for key, value in figures.items() if value is not None}

    def tags(self) -> dict[str, str]:
        return {"qac.cost.device": self.device, "qac.cost.energy": self.energy}


class CostMeter:
    """``with CostMeter() as meter:`` the work; then ``meter.cost``. ``powercap``, ``nvml`` (a pynvml-like
    module, None: none) and ``environ`` are where the readings come from."""

    def __init__(self, *, powercap: Path = POWERCAP, nvml: Any = _NOT_IMPORTED, interval: float = SAMPLE_SECONDS,
                 environ: Mapping[str, str] | None = None):
        self.powercap, self.interval = powercap, interval
        self.nvml = _import_pynvml() if nvml is _NOT_IMPORTED else nvml
        self.environ = os.environ if environ is None else environ
        self.cost: Cost | None = None

    def __enter__(self) -> "CostMeter":
        cuda = _cuda_in_use()
        if cuda is not None:    # a process that ran a stage before: its peak is not this stage's
            cuda.reset_peak_memory_stats()
        zones, self.rapl_note = rapl_zones(self.powercap)
        self.rapl = RaplCounter(zones) if zones else None
        self.gpus, self.nvml_note = NvmlCounter.open(self.nvml, self.environ)
        self.stop = threading.Event()
        self.sampler = None
        if self.rapl is not None:
            self.sampler = threading.Thread(target=self._sample, name="qac-rapl", daemon=True)
            self.sampler.start()
        self.started, self.cpu_started = time.perf_counter(), _cpu_seconds()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(self.interval):
            self.rapl.sample()

    def __exit__(self, *exc_info) -> None:
        wall, cpu = time.perf_counter() - self.started, _cpu_seconds() - self.cpu_started
        self.stop.set()
        if self.sampler is not None:
            self.sampler.join()
            self.rapl.sample()
        cuda = _cuda_in_use()
        gpu_joules, gpu_note = None, "GPU not used"
        if cuda is not None and self.gpus is not None:
            gpu_joules, gpu_note = self.gpus.joules()
        elif cuda is not None:
            gpu_note = f"GPU {self.nvml_note}"
        cpu_note = (f"RAPL {', '.join(zone.name for zone in self.rapl.zones)}" if self.rapl is not None
                    else f"CPU {self.rapl_note}")
        devices, here = int(self.environ.get("WORLD_SIZE", 1)), int(self.environ.get("LOCAL_WORLD_SIZE", 1))
        where = f"; this node's {here} of {devices} ranks only" if devices > here else ""
        self.cost = Cost(wall_seconds=wall, devices=devices,
                         device="cuda" if cuda is not None else "cpu", cpu_seconds=cpu, peak_rss_mb=_peak_rss_mb(),
                         peak_gpu_mb=cuda.max_memory_allocated() / 2**20 if cuda is not None else None,
                         energy_cpu_j=self.rapl.joules if self.rapl is not None else None,
                         energy_gpu_j=gpu_joules, energy=f"{cpu_note}; {gpu_note}{where}")
