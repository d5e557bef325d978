# SPDX-License-Identifier: Apache-2.0
"""The wire generator (apigen/scripts/gen_remoting.py) refuses every inconsistent annotation."""
import copy
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "apigen" / "scripts" / "gen_remoting.py"
POLICY = json.loads((ROOT / "apigen" / "remoting.json").read_text())


@pytest.fixture(scope="module")
def model(build_dir) -> pathlib.Path:
    path = build_dir / "apigen" / "include" / "phos" / "cuda_api" / "cuda_api.json"
    if not path.exists():
        pytest.skip("apigen's model was not built (needs libclang)")
    return path


def generate(model, policy, tmp_path):
    policy_path = tmp_path / "remoting.json"
    policy_path.write_text(policy if isinstance(policy, str) else json.dumps(policy))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(GENERATOR), str(model), str(policy_path), str(out)],
                          capture_output=True, text=True, timeout=60)


def refused(model, tmp_path, mutate, message):
    policy = copy.deepcopy(POLICY)
    mutate(policy)
    r = generate(model, policy, tmp_path)
    assert r.returncode != 0, "the generator accepted it"
    assert message in r.stderr, r.stderr


def test_the_project_annotation_generates_every_file(model, tmp_path):
    r = generate(model, POLICY, tmp_path)
    assert r.returncode == 0, r.stderr
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {"wire_messages.h", "client_hooks.h", "remote_client.cpp", "server_hooks.h",
                     "remote_server.cpp", "handle_types.h", "remoting_report.txt"}
    report = (tmp_path / "out" / "remoting_report.txt").read_text()
    # Every variant of an annotated name is served from its one annotation.
    for symbol in ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", "cuCtxCreate_v2", "cuCtxCreate_v4"):
        assert f"\n{symbol}\t" in report
    server = (tmp_path / "out" / "server_hooks.h").read_text()
    # Variants with other signatures are other overloads of the one hook.
    assert server.count("CUresult cuCtxCreate(") == 3


def test_an_unknown_entry_point_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["remoted"].update(cuNoSuchCall={"why": "x"}),
            "cuNoSuchCall is not an entry point of cuda.h")


def test_an_unknown_parameter_is_refused(model, tmp_path):
    refused(model, tmp_path,
            lambda p: p["remoted"]["cuMemAlloc"].update(params={"nonsense": "out"}),
            "nonsense is not a parameter of cuMemAlloc")


def test_an_unknown_encoding_is_refused(model, tmp_path):
    refused(model, tmp_path,
            lambda p: p["remoted"]["cuPointerGetAttribute"]["params"].update(data="telepathy"),
            'unknown encoding "telepathy"')


def test_an_encoding_without_its_count_is_refused(model, tmp_path):
    refused(model, tmp_path,
            lambda p: p["remoted"]["cuPointerGetAttributes"]["params"].update(attributes="array"),
            'needs an argument')


def test_a_count_parameter_that_does_not_exist_is_refused(model, tmp_path):
    refused(model, tmp_path,
            lambda p: p["remoted"]["cuPointerGetAttributes"]["params"].update(attributes="array:howMany"),
            "count parameter howMany does not exist")


def test_an_array_of_fewer_elements_never_reads_a_negative_count(model, tmp_path):
    """"array:n-k" (a tensor map's strides between n dimensions, n-1; an im2col box's corners, n-2): the
    shim sends n - k elements, and none for n up to k, where an unsigned n - k would wrap around."""
    r = generate(model, POLICY, tmp_path)
    assert r.returncode == 0, r.stderr
    client = (tmp_path / "out" / "remote_client.cpp").read_text()
    assert ("ipc::Blob::of(globalStrides, sizeof(cuuint64_t) * "
            "(tensorRank > 1 ? static_cast<size_t>(tensorRank) - 1 : 0))") in client
    server = (tmp_path / "out" / "remote_server.cpp").read_text()
    assert "(req.tensorRank > 1 ? static_cast<size_t>(req.tensorRank) - 1 : 0)" in server
    assert ("ipc::Blob::of(pixelBoxLowerCorner, sizeof(int) * "
            "(tensorRank > 2 ? static_cast<size_t>(tensorRank) - 2 : 0))") in client
    refused(model, tmp_path, lambda p: p["remoted"]["cuTensorMapEncodeTiled"]["params"].update(
        globalStrides="array:tensorRank-x"), "a count less a number")
    refused(model, tmp_path, lambda p: p["remoted"]["cuTensorMapEncodeTiled"]["params"].update(
        globalStrides="array:rank-1"), "count parameter rank does not exist")


def test_an_application_address_without_a_server_hook_is_refused(model, tmp_path):
    def mutate(p):
        del p["remoted"]["cuMemHostGetFlags"]["server"]
    refused(model, tmp_path, mutate, '"address" needs "server": "hook"')


def test_a_generated_out_array_of_handles_is_refused(model, tmp_path):
    # The generated server lends the driver arrays of scalars and enums only.
    def mutate(p):
        p["remoted"]["cuModuleEnumerateFunctions"] = {"why": "test", "params": {"functions": "out_array:numFunctions"}}
    refused(model, tmp_path, mutate, '"out_array" of struct CUfunc_st * needs "server": "hook"')


def test_an_entry_point_both_remoted_and_excluded_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["excluded"].update(cuMemAlloc="no"),
            "cuMemAlloc is remoted and excluded")


def test_an_entry_point_left_unaccounted_for_is_refused(model, tmp_path):
    # cuLaunchCooperativeKernelMultiDevice has an array of launch parameters
    # no ordinary encoding describes.
    refused(model, tmp_path, lambda p: p["excluded"].pop("cuLaunchCooperativeKernelMultiDevice"),
            "cuLaunchCooperativeKernelMultiDevice has no encoding for")


def test_an_exclusion_matching_nothing_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["excluded"].update({"cuNothing*": "x"}),
            "excluded cuNothing* matches no entry point")


def test_a_posted_call_with_outputs_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["remoted"]["cuMemAlloc"].update(posted="always"),
            "a posted call has no reply")


def test_reply_extras_without_an_epilogue_are_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["remoted"]["cuMemAlloc"].update(reply={"x": "u64"}),
            "reply extras need a server hook and a client epilogue")


def test_a_revision_that_is_not_one_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["remoted"]["cuMemAlloc"].update(revisions=["cuMemFree"]),
            "cuMemFree is not an older revision of cuMemAlloc")


@pytest.mark.parametrize("lane, message", [
    (["sideways", "srcHost", "ByteCount"], '["to_device" or "from_device"'),
    (["to_device", "srcHost"], '["to_device" or "from_device"'),
    (["either", "dstDevice", "srcHost"], '["either", destination, source, byte count]'),
    (["to_device", "source", "ByteCount"], "lane: source is not a parameter of cuMemcpyHtoD"),
])
def test_a_malformed_lane_is_refused(model, tmp_path, lane, message):
    refused(model, tmp_path, lambda p: p["remoted"]["cuMemcpyHtoD"].update(lane=lane), message)


def test_a_lane_without_a_server_hook_is_refused(model, tmp_path):
    def mutate(p):
        p["remoted"]["cuMemcpyDtoD"].pop("server")
        p["remoted"]["cuMemcpyDtoD"]["lane"] = ["to_device", "srcDevice", "ByteCount"]
    refused(model, tmp_path, mutate, "a copy through a lane needs \"server\": \"hook\"")


def test_an_annotation_without_a_reason_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["remoted"]["cuMemAlloc"].pop("why"), 'say why')


def test_a_name_both_local_and_remoted_is_refused(model, tmp_path):
    refused(model, tmp_path, lambda p: p["local"].update(cuMemAlloc="x"), "cuMemAlloc is both local and remoted")


def test_malformed_json_is_refused(model, tmp_path):
    r = generate(model, '{"remoted": ', tmp_path)
    assert r.returncode != 0
    assert "not valid JSON" in r.stderr


def test_docs_list_every_exclusion_with_its_reason():
    """docs/remoting.md's table of what is not remoted is the policy's, entry for entry."""
    import re
    text = (ROOT / "docs" / "remoting.md").read_text()
    documented = dict(re.findall(r"^\| `(cu[A-Za-z0-9_*]+)` \| ([^|]+) \|$", text, re.MULTILINE))
    assert documented == POLICY["excluded"]
