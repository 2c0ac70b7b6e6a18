"""Makes LocalStack 4.8.1's hypercorn runtime server stop on SIGTERM.

``HypercornRuntimeServer.shutdown`` runs on a thread of its own and calls
``loop.stop()`` on the asyncio loop directly, which is not thread-safe: when
the loop is already back in ``select()`` it never sees the flag and the
process hangs until killed (seen about one stop in two). Here the same steps
are scheduled with ``call_soon_threadsafe``, which wakes the loop.

tests/localstack/start uses hypercorn (GATEWAY_SERVER=hypercorn) because the
default twisted server ignores the host of GATEWAY_LISTEN and binds 0.0.0.0.
"""

from localstack.runtime import hooks


def _shutdown(self):
    loop = self.loop
    loop.call_soon_threadsafe(self._close.set)
    loop.call_soon_threadsafe(loop.stop)


@hooks.on_infra_start()
def fix_hypercorn_shutdown():
    from localstack.runtime.server import hypercorn

    hypercorn.HypercornRuntimeServer.shutdown = _shutdown
