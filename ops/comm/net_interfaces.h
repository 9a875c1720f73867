// Which of a host's network interfaces gradcomp's TCP connections use, and in which order a
// rank tries a peer's addresses.
//
// Why it matters: under GRADCOMP_CROSS_COMMUNICATOR=auto the gradients between nodes travel on
// these connections, so the interface chosen is the training step's link. Hosts have several:
// a slow management NIC beside a fast data NIC, container bridges (docker0 is 172.17.0.1 on
// every host that runs Docker, virbr0 192.168.122.1 on every libvirt host), networks that reach
// only a storage array. Trying a peer's addresses in the order its system lists them can pick the
// slow NIC, dial this host's own docker0, or wait seconds on an address whose packets are dropped
// (every rank dials every rank below it in turn, so such waits add up to the connect timeout).
//
// The rules, after NCCL's (ib first, then anything but docker and lo, then those) and Open MPI's
// TCP BTL (reachability by subnet):
// - A rank advertises ordinary interfaces first, fastest first (/sys/class/net/NAME/speed;
//   unknown speeds after known ones, in system order among themselves), then container and VM
//   bridges (docker*, virbr*, br-*, veth*, cni*, flannel*, cali*, ...) and VPN tunnels
//   (tailscale*, wg*, zt*, tun*, tap*), then loopback.
// - A rank dialing a peer on another host skips the peer's loopback addresses, tries first the
//   addresses on a subnet of one of its own ordinary interfaces (a peer on the same network is
//   reached directly, before any routed address), then the others, and last every address that
//   is also one of its own (a shared bridge address reaches this host, not the peer; kept for a
//   peer that shares this host's network under another host name). A peer on the same host is
//   tried on 127.0.0.1 first. (tcp_connect.cc then starts the next address beside one that
//   has not connected within 250 ms: happy eyeballs.)
// GRADCOMP_CONTROLLER_IFACE (gcrun --network-interface) still names the interfaces outright.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradcomp {

struct NetInterface {
  std::string name;
  std::string address;  // dotted IPv4
  uint32_t ipv4 = 0;    // host byte order
  uint32_t netmask = 0;
  int speed_mbps = -1;  // -1: unknown (virtual NICs, many VMs' NICs)
  bool loopback = false;
};

/// True for the names of container and VM bridges and of their virtual cables (docker0, br-1a2b,
/// virbr0, veth12ab, cni0, flannel.1, cali123, weave, lxcbr0, ...) and of VPN and overlay
/// tunnels (tailscale0, wg0, zt..., tun0, tap0): reachable, maybe, but slower than a NIC.
bool IsBridgeOrTunnel(const std::string& name);

/// The interfaces that are up with an IPv4 address, in system order, with their speeds.
std::vector<NetInterface> ListNetInterfaces();

/// The addresses to advertise, best first (rules above); only the interfaces `only` names
/// (comma-separated) when it is not empty.
std::vector<NetInterface> AdvertisedInterfaces(std::vector<NetInterface> interfaces, const std::string& only);

/// The order in which a rank with interfaces `mine` tries a peer's advertised addresses
/// (rules above); same_host: the peer runs on this host.
std::vector<std::string> DialOrder(const std::vector<std::string>& advertised, bool same_host,
                                   const std::vector<NetInterface>& mine);

/// The name of the interface of `mine` whose address is `address` ("" if none).
std::string InterfaceOf(const std::string& address, const std::vector<NetInterface>& mine);

}  // namespace gradcomp
