# SPDX-License-Identifier: Apache-2.0
"""phos-vgpu-query, the deviceQuery-style tool, on vgpu with two devices.

The values checked are NVIDIA's documented ones for the part of the profile
vgpu gives its devices by default, the GeForce RTX 5090 (compute capability
12.0), and for the A100 (8.0) and H100 (9.0) profiles.
"""
import json
import os
import pathlib
import re
import subprocess

import pytest

# CUDA C++ Programming Guide (compute capability 12.0) and the RTX 5090's specifications.
RTX_5090 = {
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 170,
    "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 32,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR": 1536,
    "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 99 * 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 100 * 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK": 65536,
    "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE": 96 * 1024 * 1024,
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 12,
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
}

# CUDA C Programming Guide (compute capability 8.0) and the A100 data sheet.
A100 = {
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 108,
    "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 32,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 163 * 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 164 * 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK": 65536,
    "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE": 40 * 1024 * 1024,
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 8,
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
}


@pytest.fixture(scope="module")
def query(build_dir):
    exe = build_dir / "vgpu" / "tools" / "phos-vgpu-query"
    if not exe.exists():
        pytest.skip(f"phos-vgpu-query was not built in {build_dir}")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), env.get("LD_LIBRARY_PATH", "")])
    env["PHOS_VGPU_DEVICES"] = "2"
    env.pop("PHOS_VGPU_CONFIG", None)
    env.pop("PHOS_VGPU_CC", None)

    def run(*args, **extra_env):
        proc = subprocess.run([str(exe), *args], env={**env, **extra_env}, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout
    return run


@pytest.fixture(scope="module")
def cuda_h_attributes(build_dir):
    """The CUdevice_attribute enumerators of the cuda.h the build used."""
    options = json.loads((build_dir / "meson-info" / "intro-buildoptions.json").read_text())
    toolkit = next(o["value"] for o in options if o["name"] == "toolkit")
    source = (pathlib.Path(toolkit) / "include" / "cuda.h").read_text()
    body = re.search(r"typedef enum CUdevice_attribute_enum \{(.*?)\} CUdevice_attribute;", source, re.S).group(1)
    return [name for name in re.findall(r"^\s*(CU_DEVICE_ATTRIBUTE_\w+)\s*=", body, re.M)
            if name != "CU_DEVICE_ATTRIBUTE_MAX"]


def test_json_lists_every_attribute_of_every_device(query, cuda_h_attributes):
    report = json.loads(query("--json"))
    assert report["driver_version"] == 13000
    assert report["device_count"] == 2
    assert [d["ordinal"] for d in report["devices"]] == [0, 1]
    uuids = {d["uuid"] for d in report["devices"]}
    assert len(uuids) == 2 and all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
    for device in report["devices"]:
        assert "PhOS vGPU" in device["name"]
        assert device["total_memory"] == 16 << 30
        assert list(device["attributes"]) == cuda_h_attributes
        assert device["attribute_errors"] == {}
        for name, value in RTX_5090.items():
            assert device["attributes"][name] == value, name


def test_text_names_each_attribute_with_its_value(query, cuda_h_attributes):
    text = query()
    assert text.startswith("Driver version: 13.0 (13000)\nDevices: 2\n")
    assert "Device 0: " in text and "Device 1: " in text
    for name, value in RTX_5090.items():
        assert len(re.findall(rf"^\s+{name}\s+{value}$", text, re.M)) == 2, name
    printed = re.findall(r"^\s+(CU_DEVICE_ATTRIBUTE_\w+)\s", text, re.M)
    assert printed == cuda_h_attributes * 2


def test_no_device_is_an_answer(query):
    report = json.loads(query("--json", PHOS_VGPU_DEVICES="0"))
    assert report["device_count"] == 0 and report["devices"] == []


def test_a100_profile(query):
    report = json.loads(query("--json", PHOS_VGPU_CC="8.0"))
    for device in report["devices"]:
        assert "A100" in device["name"]
        for name, value in A100.items():
            assert device["attributes"][name] == value, name


def test_h100_profile(query):
    report = json.loads(query("--json", PHOS_VGPU_CC="9.0"))
    for device in report["devices"]:
        assert device["attributes"]["CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"] == 132
        assert device["attributes"]["CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"] == 9
        assert device["attributes"]["CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"] == 0
