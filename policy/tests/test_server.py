"""The pack started the way `pulumi preview --policy-pack policy` starts it, asked over gRPC."""

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from rules import RESOURCE_RULES, STACK_RULES

PACK_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def analyzer():
    # The CLI runs `python -u -m pulumi.policy ENGINE_ADDRESS .` in the pack's folder; the pack
    # prints the port it serves on. No engine is needed for these calls.
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "."],
        cwd=PACK_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), f"the pack did not start: {server.stderr.read() if server.poll() is not None else port}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        server.kill()
        server.wait()


def analyze(stub, entry: dict):
    properties = struct_pb2.Struct()
    properties.update(entry["inputs"])
    request = analyzer_pb2.AnalyzeRequest(
        type=entry["type"], name=entry["name"], urn=f"urn:pulumi:dev::gemma-tpu::{entry['type']}::{entry['name']}",
        properties=properties,
    )
    return stub.Analyze(request, timeout=30).diagnostics


def test_the_pack_serves_every_rule_as_mandatory(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == "gemma-tpu-security"
    assert {p.name for p in info.policies} == {r.name for r in RESOURCE_RULES + STACK_RULES}
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}


def test_the_pack_passes_a_compliant_resource_and_stops_a_violating_one(analyzer, graph_entry):
    bucket = graph_entry("data")
    assert list(analyze(analyzer, bucket)) == []
    bucket["inputs"]["uniformBucketLevelAccess"] = False
    [diagnostic] = analyze(analyzer, bucket)
    assert diagnostic.policyName == "buckets-uniform-access-public-prevention"
    assert diagnostic.enforcementLevel == analyzer_pb2.MANDATORY
    assert "uniformBucketLevelAccess" in diagnostic.message
