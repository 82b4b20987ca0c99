#!/usr/bin/env python3
"""Kernel side of the kernel-as-oracle test (see README.md).

For each ruleset of the corpus this script builds a fresh pair of network
namespaces, loads the ruleset into the kernel (nft -f, or iptables-restore and
ipset restore for *.rules, ip6tables-restore for *.rules6), sends every packet of the ruleset's .jsonl file as
a real Ethernet frame into the router namespace and records what the kernel
did with it:

    {"verdict": "accept"|"drop"|"reject",
     "nat": null | {"src": [addr, port], "dst": [addr, port]},   # as seen leaving the router
     "mark": N | null,      # meta mark at the end of the hook (accepted packets only)
     "ct": "new"|"established"|"related"|"invalid"|null,  # conntrack state the kernel assigned
     "timeout": N | null,   # forwarded packets: seconds left on their conntrack entry
                            # (read from /proc/net/nf_conntrack after the group was sent)
     "error": "..."}        # only when the harness itself failed for this packet

Topology per ruleset (one "peer" namespace stands for all the hosts around the
router; it has no IP configuration, so its own stack never answers):

    peer ns: p0  p1  p2 ...     (raw AF_PACKET sockets inject and capture)
              |   |   |
    dut ns:  eth0 eth1 ...      (names = the iif/oif names of the packets;
                                 ip_forward=1, static neighbours, ruleset)

Forward-hook packets: routes in the DUT send the destination out of `oif` and
the source back through `iif`. Accept = the frame appears on the oif peer;
reject = an ICMP error / TCP RST for it appears on the iif peer; otherwise drop.
Input-hook packets: the destination address is added to `iif`; accept = the
packet reached an observation chain at the end of the input hook.

Every injected packet carries a unique identifier (IPv4 id / IPv6 flow label),
which the observation table (table inet sluice_oracle_obs) uses to set the
initial mark, record the conntrack state and record the final mark.

Namespaces are named sluice-or-<pid>-<n>-{dut,peer}; they are always deleted.
"""
import ctypes
import errno
import ipaddress
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

PID = os.getpid()
CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
LIBC = ctypes.CDLL(None, use_errno=True)
CREATED_NS = []

# ---------------------------------------------------------------- utilities


def sh(args, check=True, inp=None):
    r = subprocess.run(args, input=inp, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("command failed: %s\n%s%s" % (" ".join(args), r.stdout, r.stderr))
    return r


def ip_batch(ns, cmds, force=False):
    if not cmds:
        return
    args = ["ip", "-n", ns]
    if force:
        args.append("-force")
    args += ["-batch", "-"]
    sh(args, check=not force, inp="\n".join(cmds) + "\n")


def nsexec(ns, args, check=True, inp=None):
    return sh(["ip", "netns", "exec", ns] + args, check=check, inp=inp)


class InNetns:
    """Temporarily move this (single-threaded) process into a named netns."""

    def __init__(self, ns):
        self.ns = ns

    def __enter__(self):
        self.orig = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open("/run/netns/" + self.ns, os.O_RDONLY)
        try:
            if LIBC.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns " + self.ns)
        finally:
            os.close(fd)

    def __exit__(self, *a):
        LIBC.setns(self.orig, CLONE_NEWNET)
        os.close(self.orig)


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def is_v6(addr):
    return ":" in addr


def mac(k, side):
    return bytes([0x02, 0x5C, 0x00, 0x00, k, side])


# ------------------------------------------------------------ packet build

TCP_FLAG_BITS = {"F": 0x01, "S": 0x02, "R": 0x04, "P": 0x08, "A": 0x10, "U": 0x20, "E": 0x40, "C": 0x80}
PROTO_NUM = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58}


def l4_bytes(p, src, dst, seq=1000, ack=0, payload=b"", echo_id=None, inner=None):
    proto = p["proto"]
    v6 = is_v6(src)
    if v6:
        pseudo = socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
    else:
        pseudo = socket.inet_aton(src) + socket.inet_aton(dst)
    if proto == "tcp":
        flags = 0
        for c in p.get("tcp_flags", "S"):
            flags |= TCP_FLAG_BITS[c.upper()]
        if not flags & 0x10:
            ack = 0
        hdr = struct.pack("!HHIIBBHHH", p["sport"], p["dport"], seq, ack, 5 << 4, flags, 64240, 0, 0)
        seg = hdr + payload
        ph = pseudo + (struct.pack("!I", len(seg)) + b"\0\0\0\x06" if v6 else struct.pack("!BBH", 0, 6, len(seg)))
        c = csum(ph + seg)
        return seg[:16] + struct.pack("!H", c) + seg[18:]
    if proto == "udp":
        seg = struct.pack("!HHHH", p["sport"], p["dport"], 8 + len(payload), 0) + payload
        ph = pseudo + (struct.pack("!I", len(seg)) + b"\0\0\0\x11" if v6 else struct.pack("!BBH", 0, 17, len(seg)))
        c = csum(ph + seg) or 0xFFFF
        return seg[:6] + struct.pack("!H", c) + seg[8:]
    if proto in ("icmp", "icmpv6"):
        t, code = p.get("type", 8 if proto == "icmp" else 128), p.get("code", 0)
        if inner is not None:
            rest = b"\0\0\0\0" + inner
        else:
            rest = struct.pack("!HH", echo_id or 0, 1) + payload
        msg = struct.pack("!BBH", t, code, 0) + rest
        if proto == "icmpv6":
            ph = pseudo + struct.pack("!I", len(msg)) + b"\0\0\0\x3a"
            c = csum(ph + msg)
        else:
            c = csum(msg)
        return msg[:2] + struct.pack("!H", c) + msg[4:]
    raise ValueError("unsupported proto %r" % proto)


def ip_packet(src, dst, proto_num, l4, ident, ttl=64, dscp=0):
    if is_v6(src):
        first = (6 << 28) | ((dscp << 2) << 20) | (ident & 0xFFFFF)
        return struct.pack("!IHBB", first, len(l4), proto_num, ttl) + \
            socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst) + l4
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, dscp << 2, 20 + len(l4), ident & 0xFFFF, 0, ttl, proto_num, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return hdr + l4


def frame(dmac, smac, ippkt):
    et = 0x86DD if (ippkt[0] >> 4) == 6 else 0x0800
    return dmac + smac + struct.pack("!H", et) + ippkt


# ------------------------------------------------------------ packet parse


def parse_ip(b):
    """Parse an IP packet -> dict or None."""
    if len(b) < 20:
        return None
    v = b[0] >> 4
    if v == 4:
        ihl = (b[0] & 15) * 4
        d = {"v": 4, "id": struct.unpack("!H", b[4:6])[0], "proto": b[9],
             "src": socket.inet_ntoa(b[12:16]), "dst": socket.inet_ntoa(b[16:20])}
        l4 = b[ihl:]
    elif v == 6 and len(b) >= 40:
        d = {"v": 6, "id": struct.unpack("!I", b[0:4])[0] & 0xFFFFF, "proto": b[6],
             "src": socket.inet_ntop(socket.AF_INET6, b[8:24]), "dst": socket.inet_ntop(socket.AF_INET6, b[24:40])}
        l4 = b[40:]
    else:
        return None
    d["l4"] = l4
    if d["proto"] in (6, 17) and len(l4) >= 4:
        d["sport"], d["dport"] = struct.unpack("!HH", l4[:4])
        if d["proto"] == 6 and len(l4) >= 14:
            d["flags"] = l4[13]
            d["seq"], d["ack"] = struct.unpack("!II", l4[4:12])
    elif d["proto"] in (1, 58) and len(l4) >= 8:
        d["type"], d["code"] = l4[0], l4[1]
        d["echo_id"] = struct.unpack("!H", l4[4:6])[0]
        d["inner"] = parse_ip(l4[8:]) if (d["proto"] == 1 and d["type"] in (3, 11, 12)) or \
            (d["proto"] == 58 and d["type"] < 128) else None
    return d


class Port:
    """AF_PACKET socket on one peer interface."""

    def __init__(self, ifname, k):
        self.k = k
        self.ifname = ifname
        self.s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.s.bind((ifname, 0))
        self.s.setblocking(False)

    def send(self, fr):
        self.s.send(fr)

    def drain(self):
        out = []
        while True:
            try:
                data, addr = self.s.recvfrom(65535)
            except BlockingIOError:
                return out
            if addr[2] == PACKET_OUTGOING:
                continue
            et = struct.unpack("!H", data[12:14])[0]
            if et not in (0x0800, 0x86DD):
                continue
            p = parse_ip(data[14:])
            if p:
                out.append(p)


# ------------------------------------------------------------ the oracle

CT_BITS = {"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}


def norm_addr(a):
    return str(ipaddress.ip_address(a))


def ct_name(v):
    for k, b in CT_BITS.items():
        if v == b:
            return k
    return str(v)


class Ruleset:
    def __init__(self, path, packets, index):
        self.path = path
        self.packets = packets
        self.index = index
        names = []
        for p in packets:
            for f in ("iif", "oif"):
                n = p.get(f)
                if n and n != "lo" and n not in names:
                    names.append(n)
        self.ifnames = names
        self.dut = "sluice-or-%d-%d-dut" % (PID, index)
        self.peer = "sluice-or-%d-%d-peer" % (PID, index)

    # -- topology
    def setup(self):
        for ns in (self.dut, self.peer):
            sh(["ip", "netns", "add", ns])
            CREATED_NS.append(ns)
        nsexec(self.peer, ["sh", "-c",
                           "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;"
                           "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"])
        sysctls = {
            "net/ipv4/ip_forward": 1, "net/ipv4/conf/all/rp_filter": 0, "net/ipv4/conf/default/rp_filter": 0,
            "net/ipv4/conf/all/send_redirects": 0, "net/ipv4/conf/default/send_redirects": 0,
            "net/ipv4/icmp_ratelimit": 0, "net/ipv4/icmp_msgs_per_sec": 100000, "net/ipv4/icmp_msgs_burst": 100000,
            "net/ipv6/conf/all/forwarding": 1, "net/ipv6/conf/default/accept_dad": 0,
            "net/ipv6/conf/default/dad_transmits": 0, "net/ipv6/conf/default/accept_ra": 0,
            "net/ipv6/conf/default/router_solicitations": 0, "net/ipv6/icmp/ratelimit": 0,
            "net/ipv4/conf/all/accept_local": 1,
        }
        script = ";".join("echo %s > /proc/sys/%s" % (v, k) for k, v in sysctls.items())
        nsexec(self.dut, ["sh", "-c", script])
        cmds = []
        for k, name in enumerate(self.ifnames):
            sh(["ip", "link", "add", name, "netns", self.dut, "address", ":".join("%02x" % x for x in mac(k, 1)),
                "type", "veth", "peer", "name", "p%d" % k, "netns", self.peer,
                "address", ":".join("%02x" % x for x in mac(k, 2))])
            pm = ":".join("%02x" % x for x in mac(k, 2))
            cmds += ["link set %s up" % name,
                     "addr add 100.100.%d.1/24 dev %s" % (k, name),
                     "addr add fd00:100:%x::1/64 dev %s nodad" % (k, name),
                     "neigh replace 100.100.%d.2 lladdr %s dev %s nud permanent" % (k, pm, name),
                     "neigh replace fd00:100:%x::2 lladdr %s dev %s nud permanent" % (k, pm, name)]
        cmds.append("link set lo up")
        ip_batch(self.dut, cmds)
        ip_batch(self.peer, ["link set p%d up" % k for k in range(len(self.ifnames))])
        # The nf_conntrack sysctls exist once conntrack is in use; be liberal so
        # the hand-made sequence numbers of established flows never look invalid.
        self.ports = {}
        with InNetns(self.peer):
            for k, name in enumerate(self.ifnames):
                self.ports[name] = Port("p%d" % k, k)
        time.sleep(0.05)

    def teardown(self):
        for ns in (self.dut, self.peer):
            if ns in CREATED_NS:
                sh(["ip", "netns", "del", ns], check=False)
                CREATED_NS.remove(ns)

    # -- observation table
    def obs_table(self):
        marks4 = []
        marks6 = []
        for i, p in enumerate(self.packets):
            m = p.get("mark", 0) or 0
            if m:
                (marks6 if is_v6(p["src"]) else marks4).append((i + 1, m))
        lines = ["table inet sluice_oracle_obs {",
                 "  set ct4 { typeof ip id . ct state; flags dynamic; size 65535; }",
                 "  set ct6 { typeof ip6 flowlabel . ct state; flags dynamic; size 65535; }",
                 "  set acc4 { typeof ip id . meta mark; flags dynamic; size 65535; }",
                 "  set acc6 { typeof ip6 flowlabel . meta mark; flags dynamic; size 65535; }",
                 "  set post4 { typeof ip id . meta mark; flags dynamic; size 65535; }",
                 "  set post6 { typeof ip6 flowlabel . meta mark; flags dynamic; size 65535; }",
                 "  chain pre_mark { type filter hook prerouting priority -1000; policy accept;"]
        for ident, m in marks4:
            lines.append("    ip id %d meta mark set %d" % (ident, m))
        for ident, m in marks6:
            lines.append("    ip6 flowlabel %d meta mark set %d" % (ident, m))
        lines += ["  }",
                  "  chain pre_ct { type filter hook prerouting priority -199; policy accept;",
                  "    meta nfproto ipv4 add @ct4 { ip id . ct state }",
                  "    meta nfproto ipv6 add @ct6 { ip6 flowlabel . ct state }",
                  "  }"]
        for hook in ("input", "forward"):
            lines += ["  chain end_%s { type filter hook %s priority 2147483000; policy accept;" % (hook, hook),
                      "    meta nfproto ipv4 add @acc4 { ip id . meta mark }",
                      "    meta nfproto ipv6 add @acc6 { ip6 flowlabel . meta mark }",
                      "  }"]
        # The mark a forwarded packet leaves with, after the postrouting
        # chains (a NAT chain may change it there): what `sluice trace`
        # reports as the mark afterwards.
        lines += ["  chain end_postrouting { type filter hook postrouting priority 2147483000; policy accept;",
                  "    meta nfproto ipv4 add @post4 { ip id . meta mark }",
                  "    meta nfproto ipv6 add @post6 { ip6 flowlabel . meta mark }",
                  "  }"]
        lines.append("}")
        nsexec(self.dut, ["nft", "delete", "table", "inet", "sluice_oracle_obs"], check=False)
        nsexec(self.dut, ["nft", "-f", "-"], inp="\n".join(lines) + "\n")

    def read_set(self, name):
        r = nsexec(self.dut, ["nft", "-j", "list", "set", "inet", "sluice_oracle_obs", name])
        out = {}
        for obj in json.loads(r.stdout)["nftables"]:
            s = obj.get("set")
            if not s:
                continue
            for e in s.get("elem", []):
                if isinstance(e, dict) and "elem" in e:
                    e = e["elem"]["val"]
                c = e["concat"]
                v = c[1]
                if isinstance(v, list):  # ct state prints as a list of names
                    v = sum(CT_BITS.get(x, 0) for x in v)
                elif isinstance(v, str):
                    v = CT_BITS.get(v, v)
                out[int(c[0])] = v
        return out

    # -- ruleset
    def load_ruleset(self):
        v6 = self.path.endswith(".rules6")
        base = self.path.rsplit(".", 1)[0] if v6 or self.path.endswith(".rules") else None
        if base is not None:
            ips = base + ".ipset"
            if os.path.exists(ips):
                nsexec(self.dut, ["ipset", "restore", "-f", ips])
            nsexec(self.dut, ["ip6tables-restore" if v6 else "iptables-restore", self.path])
            # What `iptables-save` gives back, which an operator migrating
            # would hand Sluice.
            self.listing = nsexec(self.dut, ["ip6tables-save" if v6 else "iptables-save"]).stdout
        else:
            nsexec(self.dut, ["nft", "-f", self.path])
            # The kernel's own listing of it, which an operator migrating
            # would give Sluice (`nft list ruleset > FILE`), without the
            # harness's observation table.
            tables = nsexec(self.dut, ["nft", "list", "tables"]).stdout.split("\n")
            self.listing = "".join(
                nsexec(self.dut, ["nft", "list", "table", t[1], t[2]]).stdout
                for t in (l.split() for l in tables)
                if len(t) == 3 and t[0] == "table" and t[2] != "sluice_oracle_obs")

    # -- routes for one group of packets
    def group_routes(self, hook, iif, oif, pkts):
        ki = self.ifnames.index(iif)
        cmds = []
        undo = []
        if oif:
            ko = self.ifnames.index(oif)
            cmds += ["route replace default via 100.100.%d.2 dev %s" % (ko, oif),
                     "route replace ::/0 via fd00:100:%x::2 dev %s" % (ko, oif)]
            undo += ["route del default", "route del ::/0"]
        seen = set()
        for p in pkts:
            s = p["src"]
            if s not in seen:
                seen.add(s)
                if is_v6(s):
                    cmds.append("route replace %s/128 via fd00:100:%x::2 dev %s" % (s, ki, iif))
                    cmds.append("neigh replace %s lladdr %s dev %s nud permanent" %
                                (s, ":".join("%02x" % x for x in mac(ki, 2)), iif))
                    undo.append("route del %s/128" % s)
                    undo.append("neigh del %s dev %s" % (s, iif))
                else:
                    cmds.append("route replace %s/32 via 100.100.%d.2 dev %s" % (s, ki, iif))
                    undo.append("route del %s/32" % s)
            if hook == "input":
                d = p["dst"]
                if d not in seen:
                    seen.add(d)
                    if is_v6(d):
                        cmds.append("addr add %s/128 dev %s nodad" % (d, iif))
                        undo.append("addr del %s/128 dev %s" % (d, iif))
                    else:
                        cmds.append("addr add %s/32 dev %s" % (d, iif))
                        undo.append("addr del %s/32 dev %s" % (d, iif))
        ip_batch(self.dut, cmds)
        return undo

    # -- per-packet frames
    def pkt_frame(self, p, ident, seq=1000, ack=0, echo_id=None, inner=None, via=None):
        iif = via or p["iif"]
        k = self.ifnames.index(iif)
        proto = p["proto"]
        # "length": the IP total length, reached with a zero payload.
        payload = b""
        if "length" in p and inner is None:
            hdr = (40 if is_v6(p["src"]) else 20) + (20 if proto == "tcp" else 8)
            payload = b"\0" * max(0, p["length"] - hdr)
        l4 = l4_bytes(p, p["src"], p["dst"], seq=seq, ack=ack, payload=payload, echo_id=echo_id,
                      inner=inner)
        dmac = {"broadcast": b"\xff" * 6, "multicast": b"\x01\x00\x5e\x00\x00\x01"}.get(
            p.get("pkttype"), mac(k, 1))
        smac = bytes.fromhex(p["ether_saddr"].replace(":", "")) if "ether_saddr" in p else mac(k, 2)
        return frame(dmac, smac, ip_packet(p["src"], p["dst"], PROTO_NUM[proto], l4, ident,
                                                ttl=p.get("ttl", 64), dscp=p.get("dscp", 0)))

    def run(self):
        pk = self.packets
        n = len(pk)
        res = [None] * n
        aux = [dict() for _ in range(n)]
        for i, p in enumerate(pk):
            if p.get("hook") not in ("forward", "input"):
                res[i] = {"error": "hook %r not supported by the oracle" % p.get("hook")}
            elif p.get("iif") in (None, "lo") or (p["hook"] == "forward" and not p.get("oif")):
                res[i] = {"error": "packet needs iif (not lo) and, for forward, oif"}
            elif p.get("proto") not in PROTO_NUM:
                res[i] = {"error": "proto %r not supported by the oracle" % p.get("proto")}
        # group by (hook, iif, oif), then split each group so that no packet's
        # destination is another packet's source (those get routes via iif)
        by_key = {}
        for i, p in enumerate(pk):
            if res[i] is None:
                by_key.setdefault((p["hook"], p["iif"], p.get("oif") if p["hook"] == "forward" else None), []).append(i)
        groups = []
        for key, idx in by_key.items():
            chunk, srcs, dsts = [], set(), set()
            for i in idx:
                s, d = pk[i]["src"], pk[i]["dst"]
                if s == d:
                    res[i] = {"error": "source equals destination"}
                    continue
                if d in srcs or s in dsts:
                    groups.append((key, chunk))
                    chunk, srcs, dsts = [], set(), set()
                chunk.append(i)
                srcs.add(s)
                dsts.add(d)
            if chunk:
                groups.append((key, chunk))

        self.obs_table()  # conntrack is active from here on (the table uses ct state)
        # phase 1: prime the connections of established/related packets, ruleset not loaded yet
        prime_id = 60000
        for (hook, iif, oif), idx in groups:
            need = [i for i in idx if pk[i].get("ct") in ("established", "related")]
            if not need:
                continue
            undo = self.group_routes(hook, iif, oif, [pk[i] for i in idx])
            listeners = []
            for i in need:
                prime_id += 1
                try:
                    self.prime(i, pk[i], aux[i], prime_id, listeners)
                except Exception as e:  # noqa
                    res[i] = {"error": "priming failed: %s" % e}
                prime_id += 4
            for s in listeners:
                s.close()
            ip_batch(self.dut, undo, force=True)

        # phase 2: the ruleset
        self.load_ruleset()
        self.obs_table()

        for (hook, iif, oif), idx in groups:
            idx = [i for i in idx if res[i] is None]
            if not idx:
                continue
            undo = self.group_routes(hook, iif, oif, [pk[i] for i in idx])
            for port in self.ports.values():
                port.drain()
            for i in idx:
                p = pk[i]
                a = aux[i]
                fr = self.pkt_frame(p, i + 1, seq=a.get("seq", 1000), ack=a.get("ack", 0),
                                    echo_id=a.get("echo_id", 1000 + i), inner=a.get("inner"))
                self.ports[iif].send(fr)
                time.sleep(0.0005)
            time.sleep(0.15)
            caps = {name: port.drain() for name, port in self.ports.items()}
            for i in idx:
                res[i] = self.classify(i, pk[i], caps, hook, iif, oif)
            if hook == "forward":
                entries = self.conntrack_timeouts()
                for i in idx:
                    if res[i].get("verdict") == "accept":
                        p = pk[i]
                        key = (PROTO_NUM[p["proto"]], norm_addr(p["src"]), norm_addr(p["dst"]),
                               p.get("sport"), p.get("dport"))
                        res[i]["timeout"] = entries.get(key)
            ip_batch(self.dut, undo, force=True)

        ct4, ct6 = self.read_set("ct4"), self.read_set("ct6")
        acc4, acc6 = self.read_set("acc4"), self.read_set("acc6")
        post4, post6 = self.read_set("post4"), self.read_set("post6")
        for i, p in enumerate(pk):
            r = res[i]
            if "error" in r:
                continue
            v6 = is_v6(p["src"])
            ct = (ct6 if v6 else ct4).get(i + 1)
            r["ct"] = ct_name(ct) if ct is not None else None
            acc = (acc6 if v6 else acc4)
            if p["hook"] == "input":
                # The router's own stack answers accepted packets too (RST,
                # port unreachable), so reaching the end of the input hook
                # is what decides "accept".
                if i + 1 in acc:
                    r["verdict"] = "accept"
                    r.pop("reject", None)
                elif r["verdict"] is None:
                    r["verdict"] = "drop"
            if r["verdict"] == "accept":
                post = (post6 if v6 else post4)
                r["mark"] = post.get(i + 1, acc.get(i + 1)) if p["hook"] == "forward" else acc.get(i + 1)
            else:
                r["mark"] = None
                if i + 1 in acc:
                    r["error"] = "packet reached the end of the %s hook but was not seen leaving" % p["hook"]
        return res

    def conntrack_timeouts(self):
        """The DUT's conntrack entries by original tuple (protocol, source,
        destination, ports; ICMP: None), and the seconds each has left."""
        out = {}
        text = nsexec(self.dut, ["cat", "/proc/net/nf_conntrack"], check=False).stdout
        for line in (text or "").splitlines():
            f = line.split()
            if len(f) < 6:
                continue
            try:
                proto, left = int(f[3]), int(f[4])
            except ValueError:
                continue
            kv = {}
            for w in f[5:]:
                if "=" in w:
                    k, v = w.split("=", 1)
                    kv.setdefault(k, v)  # the original tuple comes first
            if "src" not in kv or "dst" not in kv:
                continue
            sp = int(kv["sport"]) if "sport" in kv else None
            dp = int(kv["dport"]) if "dport" in kv else None
            out[(proto, norm_addr(kv["src"]), norm_addr(kv["dst"]), sp, dp)] = left
        return out

    def prime(self, i, p, a, ident, listeners):
        """Create the connection that makes packet i established/related."""
        iif = p["iif"]
        hook = p["hook"]
        oif = p.get("oif")
        proto = p["proto"]
        if p["ct"] == "related":
            # a UDP flow from p.dst to p.src; p is an ICMP error about it coming back
            if hook != "forward" or proto not in ("icmp", "icmpv6"):
                raise ValueError("related packets: forward ICMP errors only")
            flow = {"proto": "udp", "src": p["dst"], "dst": p["src"], "sport": 30000 + i, "dport": 53}
            orig = l4_bytes(flow, flow["src"], flow["dst"], payload=b"x" * 8)
            oip = ip_packet(flow["src"], flow["dst"], 17, orig, ident)
            ko = self.ifnames.index(oif)
            self.ports[oif].drain()
            self.ports[iif].drain()
            self.ports[oif].send(frame(mac(ko, 1), mac(ko, 2), oip))
            self.expect(iif, lambda c: c["id"] == ident, "related flow's first packet")
            a["inner"] = oip[:(40 if is_v6(flow["src"]) else 20) + 8]
            return
        # established: original packet, reply, then p itself is the next original packet
        first = dict(p)
        if proto == "tcp":
            first["tcp_flags"] = "S"
        if proto == "icmp":
            first["type"], first["code"] = 8, 0
        if proto == "icmpv6":
            first["type"], first["code"] = 128, 0
        echo_id = 1000 + i
        a["echo_id"] = echo_id
        ki = self.ifnames.index(iif)
        for port in self.ports.values():
            port.drain()
        if hook == "input":
            if proto == "tcp":
                with InNetns(self.dut):
                    fam = socket.AF_INET6 if is_v6(p["dst"]) else socket.AF_INET
                    s = socket.socket(fam, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((p["dst"], p["dport"]))
                    s.listen(64)
                    listeners.append(s)
                self.ports[iif].send(self.pkt_frame(first, ident, seq=1000))
                c = self.expect(iif, lambda c: c["proto"] == 6 and c.get("dport") == p["sport"]
                                and c.get("flags", 0) & 0x12 == 0x12, "SYN-ACK from the router")
                a["seq"], a["ack"] = 1001, (c["seq"] + 1) & 0xFFFFFFFF
            elif proto == "udp":
                with InNetns(self.dut):
                    fam = socket.AF_INET6 if is_v6(p["dst"]) else socket.AF_INET
                    s = socket.socket(fam, socket.SOCK_DGRAM)
                    s.bind((p["dst"], p["dport"]))
                    listeners.append(s)
                # The priming datagram is set-up, not a packet under test: one
                # lost on its way in (seen once in CI, never reproduced alone)
                # is sent again, once, and said on stderr.
                for attempt in range(2):
                    self.ports[iif].send(self.pkt_frame(first, ident))
                    r, _, _ = select.select([s], [], [], 1.0)
                    if r:
                        break
                    if attempt == 0:
                        sys.stderr.write("oracle: UDP priming datagram to %s:%s not received "
                                         "within 1 s; sent again\n" % (p["dst"], p["dport"]))
                if not r:
                    raise RuntimeError("UDP priming packet did not reach the router's socket")
                _, peer = s.recvfrom(2048)
                s.sendto(b"reply", peer)
                self.expect(iif, lambda c: c["proto"] == 17 and c.get("dport") == p["sport"], "UDP reply")
            else:
                self.ports[iif].send(self.pkt_frame(first, ident, echo_id=echo_id))
                self.expect(iif, lambda c: c.get("type") in (0, 129) and c.get("echo_id") == echo_id, "echo reply")
            return
        ko = self.ifnames.index(oif)
        self.ports[iif].send(self.pkt_frame(first, ident, seq=1000, echo_id=echo_id))
        self.expect(oif, lambda c: c["id"] == (ident & (0xFFFFF if is_v6(p["src"]) else 0xFFFF)), "first packet")
        rep = dict(p)
        rep["src"], rep["dst"] = p["dst"], p["src"]
        if proto in ("tcp", "udp"):
            rep["sport"], rep["dport"] = p["dport"], p["sport"]
        if proto == "tcp":
            rep["tcp_flags"] = "SA"
            l4 = l4_bytes(rep, rep["src"], rep["dst"], seq=5000, ack=1001)
            a["seq"], a["ack"] = 1001, 5001
        else:
            if proto == "icmp":
                rep["type"], rep["code"] = 0, 0
            if proto == "icmpv6":
                rep["type"], rep["code"] = 129, 0
            l4 = l4_bytes(rep, rep["src"], rep["dst"], echo_id=echo_id)
        rip = ip_packet(rep["src"], rep["dst"], PROTO_NUM[proto], l4, ident + 1)
        self.ports[oif].send(frame(mac(ko, 1), mac(ko, 2), rip))
        self.expect(iif, lambda c: c["id"] == ident + 1, "reply packet")

    def expect(self, name, pred, what):
        end = time.time() + 1.0
        while time.time() < end:
            select.select([self.ports[name].s], [], [], 0.05)
            for c in self.ports[name].drain():
                if pred(c):
                    return c
        raise RuntimeError("%s not seen on %s" % (what, name))

    def classify(self, i, p, caps, hook, iif, oif):
        ident = i + 1
        v6 = is_v6(p["src"])
        proto = PROTO_NUM[p["proto"]]
        if hook == "forward":
            for c in caps[oif]:
                if c["v"] == (6 if v6 else 4) and c["id"] == ident and c["proto"] == proto:
                    nat = None
                    sp, dp = p.get("sport"), p.get("dport")
                    if c["src"] != p["src"] or c["dst"] != p["dst"] or c.get("sport") != sp or c.get("dport") != dp:
                        nat = {"src": [c["src"], c.get("sport")], "dst": [c["dst"], c.get("dport")]}
                    ko = self.ifnames.index(oif)
                    return {"verdict": "accept", "nat": nat,
                            "oif_addr": ("fd00:100:%x::1" % ko) if v6 else ("100.100.%d.1" % ko)}
        for c in caps[iif]:
            inner = c.get("inner")
            if inner and inner["id"] == ident and inner["proto"] == proto:
                return {"verdict": "reject", "nat": None, "reject": "%s type %d code %d" %
                        ("icmpv6" if v6 else "icmp", c["type"], c["code"])}
            if p["proto"] == "tcp" and c["proto"] == 6 and c.get("flags", 0) & 0x04 and \
                    c.get("dport") == p["sport"] and c["dst"] == p["src"]:
                return {"verdict": "reject", "nat": None, "reject": "tcp reset"}
        if hook == "input":
            return {"verdict": None, "nat": None}  # decided by the observation set
        return {"verdict": "drop", "nat": None}


def run_ruleset(path, index):
    jsonl = os.path.splitext(path)[0] + ".jsonl"
    with open(jsonl) as f:
        packets = [json.loads(l) for l in f if l.strip()]
    rs = Ruleset(path, packets, index)
    try:
        rs.setup()
        res = rs.run()
    finally:
        rs.teardown()
    return res, getattr(rs, "listing", None)


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory for NAME.kernel.jsonl")
    ap.add_argument("rulesets", nargs="+")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("oracle.py: needs root (network namespaces, nftables)")
    os.makedirs(a.out, exist_ok=True)
    try:
        for n, path in enumerate(a.rulesets):
            t0 = time.time()
            res, listing = run_ruleset(path, n)
            name = os.path.splitext(os.path.basename(path))[0]
            with open(os.path.join(a.out, name + ".kernel.jsonl"), "w") as f:
                for r in res:
                    f.write(json.dumps(r) + "\n")
            if listing is not None:
                ext = os.path.splitext(path)[1]
                with open(os.path.join(a.out, name + ".listing" + ext), "w") as f:
                    f.write(listing)
            print("oracle: %-32s %5d packets  %.1fs" % (os.path.basename(path), len(res), time.time() - t0),
                  file=sys.stderr, flush=True)
    finally:
        for ns in list(CREATED_NS):
            sh(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()
