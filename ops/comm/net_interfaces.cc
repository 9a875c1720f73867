#include "ops/comm/net_interfaces.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "ops/common/enforce.h"

namespace gradcomp {
namespace {

// 0: an ordinary interface, 1: a bridge or tunnel (IsBridgeOrTunnel), 2: loopback.
int Rank(const NetInterface& i) { return i.loopback ? 2 : IsBridgeOrTunnel(i.name) ? 1 : 0; }

int SpeedOf(const std::string& name) {
  // read(), not an ifstream: a failed open (out of descriptors) inside ifstream's constructor
  // trips UBSan's vptr check on libstdc++'s construction vtables.
  const int fd = ::open(("/sys/class/net/" + name + "/speed").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[32] = {};
  const ssize_t got = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (got <= 0) return -1;
  char* end = nullptr;
  const long speed = std::strtol(text, &end, 10);
  if (end == text || speed <= 0 || speed > (1L << 30)) return -1;  // down, virtual, or "unknown"
  return static_cast<int>(speed);
}

bool Parse(const std::string& address, uint32_t* ipv4) {
  in_addr a{};
  if (::inet_pton(AF_INET, address.c_str(), &a) != 1) return false;
  *ipv4 = ntohl(a.s_addr);
  return true;
}

}  // namespace

bool IsBridgeOrTunnel(const std::string& name) {
  static const char* const kPrefixes[] = {"docker",    "virbr", "br-",   "veth",   "cni",    "flannel", "cali",
                                          "weave",     "lxcbr", "lxdbr", "podman", "cilium", "kube-",   "vxlan",
                                          "tailscale", "wg",    "zt",    "tun",    "tap"};
  for (const char* prefix : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::vector<NetInterface> ListNetInterfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw Error(std::string("getifaddrs() failed: ") + std::strerror(errno));
  std::vector<NetInterface> out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    NetInterface i;
    i.name = a->ifa_name;
    i.ipv4 = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    if (a->ifa_netmask != nullptr) i.netmask = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_netmask)->sin_addr.s_addr);
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    i.address = text;
    i.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    i.speed_mbps = i.loopback ? -1 : SpeedOf(i.name);
    out.push_back(std::move(i));
  }
  ::freeifaddrs(list);
  return out;
}

std::vector<NetInterface> AdvertisedInterfaces(std::vector<NetInterface> interfaces, const std::string& only) {
  std::set<std::string> wanted;
  std::istringstream names(only);
  for (std::string name; std::getline(names, name, ',');) {
    if (!name.empty()) wanted.insert(name);
  }
  if (!wanted.empty()) {
    interfaces.erase(std::remove_if(interfaces.begin(), interfaces.end(),
                                    [&](const NetInterface& i) { return wanted.count(i.name) == 0; }),
                     interfaces.end());
  }
  std::stable_sort(interfaces.begin(), interfaces.end(), [](const NetInterface& a, const NetInterface& b) {
    if (Rank(a) != Rank(b)) return Rank(a) < Rank(b);
    return a.speed_mbps > b.speed_mbps;  // unknown (-1) after every known speed
  });
  return interfaces;
}

std::vector<std::string> DialOrder(const std::vector<std::string>& advertised, bool same_host,
                                   const std::vector<NetInterface>& mine) {
  std::vector<std::string> direct, other, own;
  auto add = [](std::vector<std::string>& to, const std::string& a) {
    if (std::find(to.begin(), to.end(), a) == to.end()) to.push_back(a);
  };
  if (same_host) {
    add(direct, "127.0.0.1");
    for (const std::string& a : advertised) add(direct, a);
    return direct;
  }
  for (const std::string& a : advertised) {
    uint32_t ip = 0;
    if (!Parse(a, &ip)) continue;
    if ((ip >> 24) == 127) continue;  // a loopback address reaches only its own host
    // One of this host's own addresses (docker0's, the same on every Docker host) reaches this
    // host: last, for a peer that is on this host after all (another host name, the same network
    // namespace: a container sharing the host's network under a name of its own).
    const bool mine_too = std::any_of(mine.begin(), mine.end(), [&](const NetInterface& i) { return i.ipv4 == ip; });
    const bool on_my_network = std::any_of(mine.begin(), mine.end(), [&](const NetInterface& i) {
      return Rank(i) == 0 && i.netmask != 0 && (i.ipv4 & i.netmask) == (ip & i.netmask);
    });
    add(mine_too ? own : on_my_network ? direct : other, a);
  }
  for (const std::string& a : other) add(direct, a);
  for (const std::string& a : own) add(direct, a);
  return direct;
}

std::string InterfaceOf(const std::string& address, const std::vector<NetInterface>& mine) {
  for (const NetInterface& i : mine) {
    if (i.address == address) return i.name;
  }
  return "";
}

}  // namespace gradcomp
