"""The committed generated code is exactly what the pinned tools produce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_protobuf_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_generated_modules_import_as_wheel_rpc_v1() -> None:
    from wheel.rpc.v1 import job_service_pb2_grpc, worker_service_pb2

    assert worker_service_pb2.DESCRIPTOR.package == "wheel.rpc.v1"
    assert hasattr(job_service_pb2_grpc, "JobServiceStub")
