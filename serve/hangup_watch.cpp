// HangupWatch's epoll thread, and the search for the socket a request came on.
#include "serve/hangup_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace tapegrad::serve {

namespace {

// Whether `fd` is a socket connected to remote_addr:remote_port.
bool connected_to(int fd, const std::string& remote_addr, int remote_port) {
  sockaddr_storage peer{};
  socklen_t size = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) return false;
  if (peer.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(peer);
    in_addr addr{};
    return ::inet_pton(AF_INET, remote_addr.c_str(), &addr) == 1 && addr.s_addr == v4.sin_addr.s_addr &&
           ntohs(v4.sin_port) == remote_port;
  }
  if (peer.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(peer);
    in6_addr addr{};
    return ::inet_pton(AF_INET6, remote_addr.c_str(), &addr) == 1 &&
           std::memcmp(&addr, &v6.sin6_addr, sizeof addr) == 0 && ntohs(v6.sin6_port) == remote_port;
  }
  return false;
}

}  // namespace

// A worker thread serves one connection at a time, so each thread remembers the socket it found
// last (checked again by one getpeername) and looks for a new connection's among the process's
// open files.
int connection_socket(const std::string& remote_addr, int remote_port) {
  thread_local int last = -1;
  if (last >= 0 && connected_to(last, remote_addr, remote_port)) return last;
  last = -1;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec == std::errc() &&
        connected_to(fd, remote_addr, remote_port))
      return last = fd;
  }
  return -1;
}

HangupWatch::HangupWatch() {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  stop_ = ::eventfd(0, EFD_CLOEXEC);
  epoll_event stop_event{.events = EPOLLIN, .data = {.u64 = 0}};  // key 0 is never a connection's
  if (epoll_ < 0 || stop_ < 0 || ::epoll_ctl(epoll_, EPOLL_CTL_ADD, stop_, &stop_event) != 0) {
    const int error = errno;
    if (epoll_ >= 0) ::close(epoll_);
    if (stop_ >= 0) ::close(stop_);
    throw std::system_error(error, std::generic_category(), "serve: cannot watch connections for hang-ups");
  }
  thread_ = std::thread([this] { run(); });
}

HangupWatch::~HangupWatch() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(stop_, &one, sizeof one);
  thread_.join();
  ::close(epoll_);
  ::close(stop_);
}

HangupWatch::Watch HangupWatch::watch(int socket, const std::shared_ptr<Job>& job) {
  if (socket < 0) return {};
  std::lock_guard lock(mutex_);
  const std::uint64_t key = next_++ << 32 | std::uint32_t(socket);
  // Once: a level-triggered hang-up would be reported again at every wait until the socket left.
  epoll_event event{.events = EPOLLRDHUP | EPOLLONESHOT, .data = {.u64 = key}};
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, socket, &event) != 0) return {};
  jobs_.emplace(key, job);
  return Watch(this, key);
}

void HangupWatch::forget(std::uint64_t key) {
  std::lock_guard lock(mutex_);
  jobs_.erase(key);
  // Under the lock, so that the socket is out of the set before another connection can be given
  // its number and watched.
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, int(key & 0xffffffffu), nullptr);
}

void HangupWatch::run() {
  ::pthread_setname_np(::pthread_self(), "serve-hangups");
  epoll_event events[16];
  for (;;) {
    const int n = ::epoll_wait(epoll_, events, 16, -1);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) return;  // the destructor's eventfd
      std::shared_ptr<Job> job;
      {
        std::lock_guard lock(mutex_);
        if (auto it = jobs_.find(events[i].data.u64); it != jobs_.end()) job = it->second.lock();
      }
      if (!job) continue;
      job->cancelled = true;  // the decoding loop frees its sequences at the next step boundary
      { std::lock_guard lock(job->mutex); }  // a waiter between its check and its wait sees the flag
      job->changed.notify_all();
      job->ended.notify_all();
    }
  }
}

}  // namespace tapegrad::serve
