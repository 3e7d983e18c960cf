// HangupWatch: cancels a request the moment its client closes the connection, rather than when its
// stream next looks at the socket (every 10 ms), so that its sequences are freed at the next step
// boundary. One thread waits in epoll for the watched connections' hang-ups and sleeps otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "serve/scheduler.h"

namespace tapegrad::serve {

/// Cancels requests whose clients close their connections (see the file's comment).
class HangupWatch {
 public:
  HangupWatch();   ///< Starts the watching thread; throws std::system_error if epoll is unavailable.
  ~HangupWatch();  ///< Stops it.
  HangupWatch(const HangupWatch&) = delete;
  HangupWatch& operator=(const HangupWatch&) = delete;

  /// A connection watched for as long as it lives.
  class Watch {
   public:
    Watch() = default;  ///< Watches nothing.
    /// Takes over other's watch; other then watches nothing.
    Watch(Watch&& other) noexcept : owner_(other.owner_), key_(other.key_) { other.owner_ = nullptr; }
    Watch& operator=(Watch&&) = delete;
    /// Ends the watch.
    ~Watch() {
      if (owner_) owner_->forget(key_);
    }

   private:
    friend class HangupWatch;
    Watch(HangupWatch* owner, std::uint64_t key) : owner_(owner), key_(key) {}
    HangupWatch* owner_ = nullptr;
    std::uint64_t key_ = 0;
  };

  /// Cancels `job` (Job::cancelled, and its waiting threads woken) if the client at the other end
  /// of `socket` closes its side before the returned Watch is destroyed. A socket it cannot watch
  /// (-1, or refused by epoll) gives a Watch that does nothing: the stream's own check remains.
  [[nodiscard]] Watch watch(int socket, const std::shared_ptr<Job>& job);

 private:
  void forget(std::uint64_t key);
  void run();

  int epoll_ = -1, stop_ = -1;  // the epoll set, and an eventfd in it that ends run()
  std::mutex mutex_;
  // By key: the socket in the low 32 bits and a counter above, so that an event of a socket
  // closed and reused by another connection cannot cancel the new one's request.
  std::unordered_map<std::uint64_t, std::weak_ptr<Job>> jobs_;
  std::uint64_t next_ = 1;
  std::thread thread_;
};

/// The socket of the connection from remote_addr:remote_port (a request's peer, as the HTTP library
/// gives it), or -1: the library does not say which socket a request came on.
int connection_socket(const std::string& remote_addr, int remote_port);

}  // namespace tapegrad::serve
