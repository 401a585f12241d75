"""A live node (in process, serving gRPC) with an outbox relay."""

from __future__ import annotations

from tests.ops._node import LiveNode
from wheel.node import NodeConfig, OutboxRelay


class RelayingNode(LiveNode):
    """A live node with an outbox relay on ``outbox_dsn`` (default: its own
    store's database), polling every ``poll_s``; ``record_delay_s`` as
    ``OutboxRelay`` takes it."""

    relay: OutboxRelay

    def __init__(
        self,
        store_url: str,
        config: NodeConfig,
        *,
        outbox_dsn: str | None = None,
        poll_s: float = 0.5,
        record_delay_s: float = 0.0,
    ) -> None:
        super().__init__(store_url, config)
        self.outbox_dsn = outbox_dsn or store_url
        self.poll_s = poll_s
        self.record_delay_s = record_delay_s

    async def _start(self) -> None:
        await super()._start()
        assert self.node is not None
        self.relay = OutboxRelay(
            self.node, self.outbox_dsn, poll_s=self.poll_s, record_delay_s=self.record_delay_s
        )
        self.relay.start()
        await self.relay.listening.wait()

    def stop(self) -> None:
        if self.node is not None:
            self.run(self.relay.stop(), timeout=30)
        super().stop()
