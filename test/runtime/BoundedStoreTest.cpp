// Tests of BoundedStore against a real c10d::TCPStore in this process: every
// operation, a wait that runs out (StoreTimeout, the connection still good),
// the server destroyed (StoreLost, its first reason kept for every later
// operation), and an operation that never answers (StoreLost at the bound).
#include "runtime/comm/BoundedStore.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using dloss::comm::BoundedStore;
using dloss::comm::StoreLost;
using dloss::comm::StoreTimeout;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A TCPStore server on a port the kernel picks, and a client of it whose
/// own timeout is `clientTimeout`.
struct Server {
  c10::intrusive_ptr<c10d::TCPStore> server;
  c10::intrusive_ptr<c10d::TCPStore> client;

  explicit Server(milliseconds clientTimeout = milliseconds(30000)) {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = milliseconds(30000);
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    c10d::TCPStoreOptions clientOptions;
    clientOptions.port = server->getPort();
    clientOptions.timeout = clientTimeout;
    client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", clientOptions);
  }
};

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(BoundedStoreTest, EveryOperationAnswers) {
  Server tcp;
  auto store = BoundedStore::over(tcp.client, /*clone=*/true,
                                  milliseconds(5000), "the store");
  store->set("a", "1");
  EXPECT_EQ(store->get("a"), "1");
  EXPECT_TRUE(store->check("a"));
  EXPECT_FALSE(store->check(std::vector<std::string>{"a", "b"}));
  store->post("b", "2");
  store->wait({"a", "b"}, milliseconds(5000));
  EXPECT_EQ(store->multiGet({"a", "b"}), (std::vector<std::string>{"1", "2"}));
  // compare_set: "" expects an unset key; the answer is the value after.
  EXPECT_EQ(store->compareSet("c", "", "x"), "x");
  EXPECT_EQ(store->compareSet("c", "y", "z"), "x");
  EXPECT_EQ(store->compareSet("c", "x", "z"), "z");
  EXPECT_TRUE(store->deleteKey("c"));
  EXPECT_FALSE(store->deleteKey("c"));
  EXPECT_TRUE(store->settled());
  EXPECT_EQ(store->failure(), "");
  // The clone is a connection of its own: the user's client still works,
  // and sees the same keys.
  EXPECT_EQ(tcp.client->get("a"), std::vector<uint8_t>{'1'});
}

TEST(BoundedStoreTest, StoreWithoutACloneIsUsedAsItIs) {
  auto hash = c10::make_intrusive<c10d::HashStore>();
  auto store =
      BoundedStore::over(hash, /*clone=*/false, milliseconds(5000), "a store");
  store->set("k", "v");
  EXPECT_EQ(store->get("k"), "v");
  EXPECT_TRUE(hash->check({"k"}));
}

TEST(BoundedStoreTest, AWaitThatRunsOutIsATimeoutAndTheStoreStaysUsable) {
  Server tcp;
  auto store = BoundedStore::over(tcp.client, /*clone=*/true,
                                  milliseconds(5000), "the store");
  Clock::time_point start = Clock::now();
  EXPECT_THROW(store->wait({"never"}, milliseconds(300)), StoreTimeout);
  EXPECT_LT(secondsSince(start), 3.0);
  // The deadline is the clone's own timeout: a get of a missing key is a
  // wait too.
  store->setDeadline(milliseconds(300));
  EXPECT_THROW(store->get("never"), StoreTimeout);
  EXPECT_EQ(store->failure(), "");
  store->set("after", "ok");
  EXPECT_EQ(store->get("after"), "ok");
}

TEST(BoundedStoreTest, ALostServerIsLostWithItsFirstReasonKept) {
  Server tcp;
  auto store = BoundedStore::over(tcp.client, /*clone=*/true,
                                  milliseconds(5000), "the test store");
  store->set("a", "1");
  tcp.client.reset();
  tcp.server.reset(); // The host exits: its connections close.
  std::string first;
  Clock::time_point start = Clock::now();
  // The first send may still be accepted by the kernel; a later one fails.
  for (int i = 0; i < 10 && first.empty(); ++i) {
    try {
      store->set("b", std::to_string(i));
    } catch (const StoreLost &e) {
      first = e.what();
    }
  }
  ASSERT_FALSE(first.empty()) << "no operation failed after the server left";
  EXPECT_LT(secondsSince(start), 5.0);
  EXPECT_NE(first.find("the test store stopped answering ("), std::string::npos)
      << first;
  EXPECT_NE(first.find("the store's host has exited, or this host is cut "
                       "off from it"),
            std::string::npos)
      << first;
  EXPECT_EQ(store->failure(), first);
  // Every later operation fails at once with the first reason, without
  // touching the connection.
  try {
    store->get("a");
    FAIL() << "a get after the loss answered";
  } catch (const StoreLost &e) {
    EXPECT_EQ(std::string(e.what()), first);
  }
  EXPECT_THROW(store->post("c", "1"), StoreLost);
  EXPECT_FALSE(store->settled());
}

TEST(BoundedStoreTest, AnOperationThatNeverAnswersEndsAtItsBound) {
  // No clone: the client keeps its own 30 s timeout, so a get of a missing
  // key waits on the server far past the bound (0.3 s and the 2 s margin).
  Server tcp(milliseconds(30000));
  auto store = BoundedStore::over(tcp.client, /*clone=*/false,
                                  milliseconds(300), "the store");
  EXPECT_EQ(store->boundFor(milliseconds(300)), milliseconds(2300));
  Clock::time_point start = Clock::now();
  std::string reason;
  try {
    store->get("never");
  } catch (const StoreLost &e) {
    reason = e.what();
  }
  double waited = secondsSince(start);
  EXPECT_GE(waited, 2.2);
  EXPECT_LT(waited, 4.0);
  EXPECT_NE(reason.find("the store did not answer within 2.3 s: this host may "
                        "be cut off from the store's host"),
            std::string::npos)
      << reason;
  // Every later operation fails at once: the worker is still stuck.
  start = Clock::now();
  EXPECT_THROW(store->set("a", "1"), StoreLost);
  EXPECT_LT(secondsSince(start), 0.5);
  // Destroying it does not wait for the stuck worker either.
  start = Clock::now();
  store.reset();
  EXPECT_LT(secondsSince(start), 0.5);
  // The server ends the stuck wait as it goes.
  tcp.client.reset();
  tcp.server.reset();
}

TEST(BoundedStoreTest, NoMarginBoundsAtTheDeadline) {
  Server tcp;
  auto store =
      BoundedStore::over(tcp.client, /*clone=*/false, milliseconds(400),
                         "the store", BoundedStore::Margin::None);
  EXPECT_EQ(store->boundFor(milliseconds(400)), milliseconds(400));
  Clock::time_point start = Clock::now();
  EXPECT_THROW(store->get("never"), StoreLost);
  EXPECT_LT(secondsSince(start), 1.5);
  tcp.client.reset();
  tcp.server.reset();
}

TEST(BoundedStoreTest, AFailedConnectionIsLost) {
  auto store = std::make_shared<BoundedStore>(
      [](const std::function<bool()> &) -> BoundedStore::Connection {
        throw std::runtime_error("no address came");
      },
      milliseconds(1000), "the mirror");
  try {
    store->check("a");
    FAIL() << "a store that never connected answered";
  } catch (const StoreLost &e) {
    EXPECT_EQ(std::string(e.what()),
              "the mirror stopped answering (no address came): the store's "
              "host has exited, or this host is cut off from it");
  }
}

TEST(BoundedStoreTest, StoppingDropsQueuedPosts) {
  Server tcp;
  auto seen = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", [&] {
    c10d::TCPStoreOptions o;
    o.port = tcp.server->getPort();
    o.timeout = milliseconds(1000);
    return o;
  }());
  {
    // A connect that takes a while: the posts queue behind it, and the
    // store is destroyed before they run.
    auto client = tcp.client;
    BoundedStore store(
        [client](const std::function<bool()> &stopping) {
          while (!stopping())
            std::this_thread::sleep_for(milliseconds(10));
          return BoundedStore::Connection{client, false};
        },
        milliseconds(1000), "the store");
    store.post("dropped", "1");
  }
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(seen->check({"dropped"}));
}

} // namespace
