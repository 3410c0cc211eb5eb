"""dloss._C.BoundedStore, the store connection dloss.guard uses, against a
real torch TCPStore in this process: every method, the builtin exception
classes (TimeoutError for a wait that runs out, ConnectionError, with the
first failure's reason, for a store that is gone or does not answer), and
the GIL released while a method waits. The C++ side's own tests are
test/runtime/BoundedStoreTest.cpp."""

import threading
import time
import unittest
from datetime import timedelta

import torch.distributed as dist

from dloss import _C


def _server():
    """A TCPStore server on a free port and a client of it whose own
    timeout is 30 s."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True,
                           wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                           timeout=timedelta(seconds=30))
    return server, client


class BoundedStoreTest(unittest.TestCase):

    def test_every_method(self):
        server, client = _server()
        store = _C.BoundedStore(client, 5.0)
        store.set("a", "1")
        store.set("b", b"\x00\xff")
        self.assertEqual(store.get("a"), b"1")
        self.assertEqual(store.get("b"), b"\x00\xff")
        self.assertTrue(store.check(["a", "b"]))
        self.assertFalse(store.check(["a", "missing"]))
        store.wait(["a", "b"], 1.0)
        store.wait(["a"], timedelta(seconds=1))
        self.assertEqual(store.multi_get(["a", "b"]), [b"1", b"\x00\xff"])
        self.assertEqual(store.compare_set("c", "", "x"), b"x")
        self.assertEqual(store.compare_set("c", "y", "z"), b"x")
        self.assertEqual(store.compare_set("c", "x", "z"), b"z")
        self.assertTrue(store.delete_key("c"))
        self.assertFalse(store.delete_key("c"))
        # A clone of its own: the user's connection and timeout stay theirs.
        store.set_deadline(2.0)
        self.assertEqual(client.timeout, timedelta(seconds=30))
        self.assertEqual(client.get("a"), b"1")
        del server

    def test_a_store_without_its_own_connection(self):
        store = _C.BoundedStore(dist.HashStore(), 5.0, clone=False)
        store.set("k", "v")
        self.assertEqual(store.get("k"), b"v")

    def test_a_wait_that_runs_out_is_a_timeout_error(self):
        server, client = _server()
        store = _C.BoundedStore(client, 5.0)
        start = time.monotonic()
        with self.assertRaises(TimeoutError) as raised:
            store.wait(["never"], 0.3)
        self.assertLess(time.monotonic() - start, 3.0)
        self.assertIn("wait timeout", str(raised.exception))
        # The connection is still good.
        store.set("after", "ok")
        self.assertEqual(store.get("after"), b"ok")
        del server

    def test_a_store_whose_host_is_gone_is_a_connection_error(self):
        server, client = _server()
        store = _C.BoundedStore(client, 5.0)
        store.set("a", "1")
        del client, server  # the host exits: its connections close
        first = None
        for i in range(10):
            try:
                store.set("b", str(i))
            except ConnectionError as e:
                first = str(e)
                break
        self.assertIsNotNone(first, "no operation failed after the host left")
        self.assertIn("the store stopped answering (", first)
        self.assertIn("the store's host has exited, or this host is cut off "
                      "from it", first)
        # Every later operation fails with the first reason.
        for op in (lambda: store.get("a"), lambda: store.check(["a"]),
                   lambda: store.wait(["a"], 1.0)):
            with self.assertRaises(ConnectionError) as raised:
                op()
            self.assertEqual(str(raised.exception), first)

    def test_an_operation_that_never_answers_ends_at_its_bound(self):
        # clone=False: the client's own 30 s timeout stays, so a get of a
        # missing key waits on the server far past the bound (0.2 s and the
        # 2 s margin).
        server, client = _server()
        store = _C.BoundedStore(client, 0.2, clone=False)
        start = time.monotonic()
        with self.assertRaises(ConnectionError) as raised:
            store.get("never")
        self.assertLess(time.monotonic() - start, 4.0)
        self.assertIn("the store did not answer within 2.2 s: this host may "
                      "be cut off from the store's host", str(raised.exception))
        del client, server

    def test_the_gil_is_released_while_a_method_waits(self):
        server, client = _server()
        store = _C.BoundedStore(client, 5.0)
        setter = _C.BoundedStore(client, 5.0)

        def later():
            time.sleep(0.2)
            setter.set("late", "1")  # Python code: needs the GIL

        thread = threading.Thread(target=later)
        thread.start()
        store.wait(["late"], 5.0)
        thread.join()
        self.assertEqual(store.get("late"), b"1")
        del server

    def test_bad_deadlines_are_refused(self):
        with self.assertRaisesRegex(Exception, "deadline_seconds must be a "
                                    "positive number of seconds, got"):
            _C.BoundedStore(dist.HashStore(), 0.0)


if __name__ == "__main__":
    unittest.main()
