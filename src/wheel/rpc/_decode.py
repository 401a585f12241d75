"""A request whose bytes are not its method's message (a corrupt wire
format, a string field that is not UTF-8) is refused INVALID_ARGUMENT naming
``request``, as any bad field is: grpc answers a deserializer that raises
with UNKNOWN ("Unexpected DecodeError"), which tells a client nothing it can
act on and reads as a server fault."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class Undecodable:
    """What the tolerant deserializer hands the handler for bytes it could not
    parse: the handler never sees it (``DecodeInterceptor`` refuses it)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Undecodable(str(exc))

    return parse


class DecodeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses an undecodable request of every unary-request method before
    its handler runs; a stream of requests (WorkerService.Connect) ends at an
    undecodable message, as if the client had closed it, and then answers
    INVALID_ARGUMENT."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method
        if handler.request_streaming and handler.response_streaming:
            return _stream(handler, method)
        if handler.request_streaming or handler.response_streaming:
            return handler  # none in wheel's services
        behaviour = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request: not a {method} request message ({request.reason})",
                )
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(
            unary, _tolerant(handler.request_deserializer), handler.response_serializer
        )


def _stream(handler: Any, method: str) -> Any:
    behaviour = handler.stream_stream

    async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        bad: list[Undecodable] = []

        async def decoded() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    bad.append(request)
                    return
                yield request

        async for response in behaviour(decoded(), context):
            yield response
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request: not a {method} request message ({bad[0].reason})",
            )

    return grpc.stream_stream_rpc_method_handler(
        stream, _tolerant(handler.request_deserializer), handler.response_serializer
    )
