"""Memory measurement the Python benchmarks share (imported from beside them).

On the CPU, LibTorch's allocator counted by the build's memory probe (src/bench/memory_probe.h:
build/src/libhp_memory_probe.so, loaded with ctypes), the same wrapper hp-bench links, so that
our code and PyTorch's are measured by one implementation; on a GPU, torch.cuda's statistics.
The probe must wrap the allocator of the LibTorch this process loaded: it is the build's, built
against this torch.
"""

import ctypes
import os

import torch

DEFAULT_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "src",
                             "libhp_memory_probe.so")


def load_memory_probe(path=DEFAULT_PROBE):
    """The probe at `path`, installed (tensors allocated before are not counted)."""
    if not os.path.exists(path):
        raise SystemExit(f"no memory probe at {path}: build the project (it makes build/src/libhp_memory_probe.so) "
                         "or pass --probe PATH")
    probe = ctypes.CDLL(path)
    probe.hp_memory_probe_current_bytes.restype = ctypes.c_int64
    probe.hp_memory_probe_peak_bytes.restype = ctypes.c_int64
    probe.hp_memory_probe_install()
    return probe


class DeviceMemory:
    """Bytes allocated now and at peak on `device`: the probe's on the CPU, torch.cuda's on a GPU."""

    def __init__(self, device, probe=None):
        self.cuda = device.type == "cuda"
        self.device = device
        self.probe = probe
        if not self.cuda and probe is None:
            raise ValueError("DeviceMemory on the CPU needs the memory probe (load_memory_probe)")

    def current(self):
        return torch.cuda.memory_allocated(self.device) if self.cuda else self.probe.hp_memory_probe_current_bytes()

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.probe.hp_memory_probe_reset_peak()

    def peak(self):
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else self.probe.hp_memory_probe_peak_bytes()

    def sync(self):
        """Waits for the device's queued work (timings need it); nothing on the CPU."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
