"""The worker SDK: register handlers, connect to wheel nodes, run what they assign.

```python
worker = Worker("node-a:50051,node-b:50051", capacity=32)

@worker.handler("send-report")
async def send_report(ctx: RunContext) -> None:
    ...  # raise Retryable / Permanent to fail; return to succeed

asyncio.run(worker.run())  # until SIGTERM/SIGINT, which drain it
```
"""

from wheel.tls import ChannelSecurity
from wheel.worker._api import (
    Permanent,
    Retryable,
    RunContext,
    RunLogFilter,
    WorkerStats,
)
from wheel.worker._loading import load_handler, load_handlers
from wheel.worker._process import run_worker
from wheel.worker._worker import Worker

__all__ = [
    "ChannelSecurity",
    "Permanent",
    "Retryable",
    "RunContext",
    "RunLogFilter",
    "Worker",
    "WorkerStats",
    "load_handler",
    "load_handlers",
    "run_worker",
]
