#!/usr/bin/env python3
"""Writes the packet lists (corpus/NAME.jsonl) and the generated rulesets of
the kernel-oracle corpus. Deterministic: run it again after editing and commit
the output.

    python3 crates/sluice/tests/oracle/gen_corpus.py

Packets are produced per rule: `rule(base, miss=...)` yields the packet that
matches the rule (base) and, for each condition, a packet that misses only
that condition. Every packet gets a unique source port, so every `ct new`
packet starts its own connection.
"""
import ipaddress
import json
import os
import random

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
_sport = [20000]

FIELDS = ["hook", "iif", "oif", "proto", "src", "sport", "dst", "dport", "type", "code", "tcp_flags", "ct", "mark",
          "ttl", "length", "dscp", "pkttype", "ether_saddr"]


def pkt(**kw):
    p = dict(kw)
    p.setdefault("ct", "new")
    p.setdefault("mark", 0)
    if p["proto"] in ("tcp", "udp"):
        if "sport" not in p:
            _sport[0] += 1
            p["sport"] = _sport[0]
        if p["proto"] == "tcp":
            p.setdefault("tcp_flags", "S")
    else:
        p.pop("sport", None)
        p.pop("dport", None)
        p.setdefault("type", 8 if p["proto"] == "icmp" else 128)
        p.setdefault("code", 0)
    if p["hook"] == "input":
        p.pop("oif", None)
    return {k: p[k] for k in FIELDS if k in p}


def rule(base, **misses):
    """The packet matching a rule, then one packet per missed condition.
    misses: field=value (or a dict of several fields to change together)."""
    out = [pkt(**base)]
    for _, m in misses.items():
        b = dict(base)
        b.update(m)
        b.pop("sport", None) if "sport" not in m else None
        out.append(pkt(**b))
    return out


def write(name, packets):
    with open(os.path.join(HERE, name + ".jsonl"), "w") as f:
        for p in packets:
            f.write(json.dumps(p, separators=(",", ":")) + "\n")


# ------------------------------------------------------------- seed 001


def seed001(with_icmp_udp=True, udp_5201=True):
    fw = dict(hook="forward", iif="eno1", oif="enp2s0", src="10.1.0.2", dst="172.16.2.3")
    out = []
    out += rule(dict(fw, proto="tcp", dport=22), port=dict(dport=23), proto=dict(proto="udp"),
                iif=dict(iif="eno2"))
    for port in (40000, 40001, 40002, 5201):
        out += rule(dict(fw, proto="tcp", dport=port), dst=dict(dst="172.16.2.4"), port=dict(dport=port + 1000),
                    proto=dict(proto="udp", dport=port + 1000))
    out += rule(dict(fw, proto="udp", dport=5201), dst=dict(dst="172.16.2.4"), port=dict(dport=5202),
                proto=dict(proto="tcp", dport=5203))
    out += rule(dict(fw, proto="icmp", dst="172.16.2.2", type=8), dst=dict(dst="172.16.2.3"),
                type=dict(type=13), v6=dict(proto="icmpv6", src="2001:db8:1::2", dst="2001:db8:2::2", type=128))
    # forward-from-lan accepts everything
    lan = dict(hook="forward", iif="enp2s0", oif="eno1", src="172.16.2.3", dst="10.1.0.2")
    out += rule(dict(lan, proto="tcp", dport=80), udp=dict(proto="udp", dport=53), icmp=dict(proto="icmp"),
                v6=dict(proto="tcp", src="2001:db8:2::3", dst="2001:db8:1::2", dport=443),
                flags=dict(tcp_flags="A"))
    # established traffic from the WAN is not special in these rulesets
    out += rule(dict(fw, proto="tcp", dport=5201, tcp_flags="A", ct="established"),
                port=dict(dport=6000))
    out += rule(dict(fw, proto="udp", dport=9999, ct="established"))
    # input: ssh only
    inp = dict(hook="input", iif="eno1", src="10.1.0.2", dst="10.1.0.1")
    out += rule(dict(inp, proto="tcp", dport=22), port=dict(dport=2222), proto=dict(proto="udp"),
                icmp=dict(proto="icmp"), v6=dict(src="2001:db8:1::2", dst="2001:db8:1::1"),
                lan=dict(iif="enp2s0", src="172.16.2.3"))
    out += rule(dict(inp, proto="tcp", dport=22, tcp_flags="A", ct="established"))
    return out


# ------------------------------------------------------------- host firewall


def host_firewall():
    h = dict(hook="input", iif="eth0", dst="198.51.100.10")
    h6 = dict(hook="input", iif="eth0", dst="2001:db8:ff::10")
    out = []
    # ct state invalid (SYN+FIN), invalid v6, stray ICMP error
    out += rule(dict(h, proto="tcp", src="10.0.0.5", dport=80, tcp_flags="SF", ct="invalid"))
    out += rule(dict(h6, proto="tcp", src="2001:db8::5", dport=80, tcp_flags="SF", ct="invalid"))
    out += rule(dict(h, proto="icmp", src="10.0.0.5", type=3, code=3, ct="invalid"))
    # established
    out += rule(dict(h, proto="tcp", src="10.0.0.5", dport=8081, tcp_flags="A", ct="established"),
                new=dict(ct="new"))
    out += rule(dict(h, proto="udp", src="10.0.0.5", dport=5353, ct="established"), new=dict(ct="new"))
    out += rule(dict(h, proto="icmp", src="10.0.0.6", type=8, ct="established"))
    out += rule(dict(h6, proto="udp", src="2001:db8::5", dport=5353, ct="established"), new=dict(ct="new"))
    # blocklist
    out += rule(dict(h, proto="tcp", src="203.0.113.9", dport=80), out=dict(src="203.0.112.9"))
    out += rule(dict(h, proto="tcp", src="198.19.255.255", dport=443), lo=dict(src="198.17.255.255"),
                hi=dict(src="198.20.0.0"), first=dict(src="198.18.0.0"))
    # icmp essentials (limit 10/s burst 20: stay well below)
    out += rule(dict(h, proto="icmp", src="10.0.0.7", type=8), type=dict(type=13),
                v6=dict(proto="icmpv6", src="2001:db8::7", dst="2001:db8:ff::10", type=128))
    out += rule(dict(h6, proto="icmpv6", src="2001:db8::8", type=128), type=dict(type=139, code=0))
    # ssh from admin nets
    out += rule(dict(h, proto="tcp", src="192.0.2.44", dport=22), src=dict(src="192.0.3.44"),
                port=dict(dport=23), proto=dict(proto="udp"), host=dict(src="198.51.100.7"),
                host_miss=dict(src="198.51.100.8"), v6=dict(src="2001:db8::44", dst="2001:db8:ff::10"))
    # http/https
    out += rule(dict(h, proto="tcp", src="10.0.0.9", dport=80), https=dict(dport=443), miss=dict(dport=8080),
                udp=dict(proto="udp"), v6=dict(src="2001:db8::9", dst="2001:db8:ff::10"),
                ack=dict(tcp_flags="A"))
    # dns from link-local v6
    out += rule(dict(h6, proto="udp", src="fe80::1234", dport=53), src=dict(src="2001:db8::53"),
                port=dict(dport=54), tcp=dict(proto="tcp"), v4=dict(src="10.0.0.10", dst="198.51.100.10"))
    # non-SYN new TCP is dropped, other new TCP gets a reset, the rest icmpx
    out += rule(dict(h, proto="tcp", src="10.0.0.11", dport=8080, tcp_flags="A"), syn=dict(tcp_flags="S"),
                synack=dict(tcp_flags="SA", ct="invalid"), fin=dict(tcp_flags="F", ct="invalid"),
                rst=dict(tcp_flags="R", ct="invalid"), push=dict(tcp_flags="PA"),
                v6=dict(src="2001:db8::11", dst="2001:db8:ff::10"))
    out += rule(dict(h, proto="udp", src="10.0.0.12", dport=123), v6=dict(src="2001:db8::12", dst="2001:db8:ff::10"))
    out += rule(dict(h, proto="icmp", src="10.0.0.13", type=13))
    # forward: policy drop, marks do not matter
    fw = dict(hook="forward", iif="eth0", oif="eth1", src="10.0.0.5", dst="192.0.2.80")
    out += rule(dict(fw, proto="tcp", dport=80), est=dict(tcp_flags="A", ct="established"),
                mark=dict(mark=2), v6=dict(src="2001:db8::5", dst="2001:db8:2::80"))
    return out


# ------------------------------------------------------------- router with NAT


def router_nat():
    wan = dict(hook="forward", iif="ppp0", oif="br-lan", src="198.51.100.50", dst="203.0.113.1")
    lan = dict(hook="forward", iif="br-lan", oif="ppp0", src="192.168.1.50", dst="198.51.100.50")
    out = []
    # port forwards (prerouting dnat) + forward "ct status dnat accept"
    out += rule(dict(wan, proto="tcp", dport=80), https=dict(dport=443), miss=dict(dport=81),
                udp=dict(proto="udp"), iif=dict(iif="wg0"))
    out += rule(dict(wan, proto="tcp", dport=2222), other=dict(dport=8443), miss=dict(dport=2223),
                udp=dict(proto="udp", dport=8443))
    # wan_in: to the web server directly (no dnat needed)
    out += rule(dict(wan, proto="tcp", dst="192.168.1.10", dport=443), dst=dict(dst="192.168.1.11"),
                port=dict(dport=444), icmp=dict(proto="icmp"))
    # lan_in: out to the WAN with masquerade for lan_nets
    out += rule(dict(lan, proto="tcp", dport=443), src2=dict(src="10.8.200.1"), nomasq=dict(src="172.20.0.5"),
                udp=dict(proto="udp", dport=53), icmp=dict(proto="icmp"), oif=dict(oif="wg0"),
                mark=dict(mark=7))
    # wg0 has no vmap entry
    out += rule(dict(hook="forward", iif="wg0", oif="ppp0", proto="tcp", src="10.9.0.5", dst="198.51.100.50",
                     dport=80))
    # established / related
    out += rule(dict(wan, proto="tcp", dst="192.168.1.50", dport=51000, tcp_flags="A", ct="established"),
                new=dict(ct="new"))
    out += rule(dict(wan, proto="udp", dst="192.168.1.50", dport=51001, ct="established"))
    out += rule(dict(wan, proto="icmp", dst="192.168.1.50", type=3, code=3, ct="related"),
                invalid=dict(ct="invalid"))
    # input
    ri = dict(hook="input", iif="br-lan", src="192.168.1.50", dst="192.168.1.1")
    out += rule(dict(ri, proto="tcp", dport=22), dns=dict(dport=53), miss=dict(dport=80),
                wan=dict(iif="ppp0", src="198.51.100.50", dst="203.0.113.1"))
    out += rule(dict(ri, proto="udp", dport=53), dhcp=dict(dport=67), miss=dict(dport=68),
                wan=dict(iif="ppp0", src="198.51.100.50", dst="203.0.113.1"))
    out += rule(dict(ri, proto="icmp", src="198.51.100.51", dst="203.0.113.1", iif="ppp0", type=8,
                     ct="established"), new=dict(ct="new"))
    return out


# ------------------------------------------------------------- container host (iptables)


def container_host():
    out = []
    h = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1")
    out += rule(dict(h, proto="tcp", dport=22), ack=dict(tcp_flags="A"), port=dict(dport=80),
                udp=dict(proto="udp", dport=22))
    out += rule(dict(h, proto="tcp", dport=22, tcp_flags="PA", ct="established"))
    out += rule(dict(h, proto="tcp", dport=80, tcp_flags="SF", ct="invalid"))
    out += rule(dict(h, proto="icmp", type=8), type=dict(type=13))
    out += rule(dict(h, proto="udp", dport=53), ntp=dict(dport=123), range=dict(dport=5050), miss=dict(dport=5101),
                docker=dict(iif="docker0", src="172.17.0.3"))
    out += rule(dict(h, proto="icmp", type=8, ct="established"))
    fw = dict(hook="forward", iif="eth0", oif="docker0", src="198.51.100.9", dst="172.17.0.2")
    out += rule(dict(fw, proto="tcp", dport=80), dst=dict(dst="172.17.0.3"), port=dict(dport=81),
                udp=dict(proto="udp"), oif=dict(oif="eth1", dst="192.0.2.1"))
    out += rule(dict(fw, proto="tcp", dport=8080, tcp_flags="A", ct="established"),
                new=dict(ct="new"))
    out += rule(dict(fw, proto="udp", dport=5000), est=dict(ct="established", dport=5001))
    out += rule(dict(hook="forward", iif="docker0", oif="eth0", proto="tcp", src="172.17.0.2", dst="198.51.100.9",
                     dport=443), udp=dict(proto="udp", dport=53), icmp=dict(proto="icmp"),
                nomasq=dict(src="10.5.0.2"), eth1=dict(oif="eth1"))
    out += rule(dict(hook="forward", iif="docker0", oif="docker0", proto="tcp", src="172.17.0.3", dst="172.17.0.2",
                     dport=80), port=dict(dport=5432))
    out += rule(dict(hook="forward", iif="eth1", oif="eth0", proto="tcp", src="192.0.2.1", dst="198.51.100.9",
                     dport=80))
    return out


# ------------------------------------------------------------- port forwarding (hand written)

PORT_FORWARD = """\
# Port forwarding gateway: DNAT with ports, a map, SNAT and masquerade.
define WAN = "wan0"
define LAN = "lan0"
define public = 203.0.113.1

table ip pf {
    map tcpfwd {
        type inet_service : ipv4_addr
        elements = { 2201 : 10.0.0.21, 2202 : 10.0.0.22 }
    }

    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        iifname $WAN ip daddr $public tcp dport 443 dnat to 10.0.0.20
        iifname $WAN ip daddr $public tcp dport 8080 dnat to 10.0.0.10:80
        iifname $WAN udp dport 5000-5010 dnat to 10.0.0.30:6000
        iifname $WAN ip daddr $public dnat to tcp dport map @tcpfwd
    }

    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        oifname $WAN ip saddr 10.0.0.0/24 snat to $public
        oifname $WAN ip saddr 10.0.1.0/24 masquerade
    }

    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        ct state invalid drop
        iifname $LAN oifname $WAN accept
        iifname $WAN ip daddr 10.0.0.40 tcp dport 25 reject with tcp reset
        iifname $WAN icmp type echo-request reject with icmp type admin-prohibited
        iifname $WAN ct status dnat accept
        iifname $WAN ip daddr 10.0.0.50 meta l4proto udp reject
    }
}
"""


def port_forward():
    w = dict(hook="forward", iif="wan0", oif="lan0", src="198.51.100.20", dst="203.0.113.1")
    out = []
    out += rule(dict(w, proto="tcp", dport=443), dst=dict(dst="203.0.113.2"), port=dict(dport=442),
                iif=dict(iif="wan1"))
    out += rule(dict(w, proto="tcp", dport=8080), port=dict(dport=8081), udp=dict(proto="udp"))
    out += rule(dict(w, proto="udp", dport=5005), lo=dict(dport=5000), hi=dict(dport=5010), miss=dict(dport=5011),
                other_dst=dict(dst="203.0.113.7"), tcp=dict(proto="tcp", dport=5006))
    out += rule(dict(w, proto="tcp", dport=2201), two=dict(dport=2202), miss=dict(dport=2203))
    out += rule(dict(w, proto="tcp", dst="10.0.0.40", dport=25), port=dict(dport=26), dst=dict(dst="10.0.0.41"))
    out += rule(dict(w, proto="icmp", dst="10.0.0.40", type=8), type=dict(type=13))
    out += rule(dict(w, proto="udp", dst="10.0.0.50", dport=9), tcp=dict(proto="tcp"))
    l = dict(hook="forward", iif="lan0", oif="wan0", src="10.0.0.77", dst="198.51.100.20")
    out += rule(dict(l, proto="tcp", dport=80), masq=dict(src="10.0.1.77"), none=dict(src="10.0.2.77"),
                udp=dict(proto="udp", dport=53), icmp=dict(proto="icmp"), oif=dict(oif="lan1"))
    out += rule(dict(w, proto="tcp", dst="10.0.0.77", dport=40000, tcp_flags="A", ct="established"))
    out += rule(dict(w, proto="icmp", dst="10.0.0.77", type=3, code=1, ct="related"))
    out += rule(dict(w, proto="tcp", dst="10.0.0.77", dport=40001, tcp_flags="SF", ct="invalid"))
    return out


# ------------------------------------------------------------- container host (nft)

CONTAINER_NFT = """\
# Container host in nft form: user chains, jump/goto/return, sets, vmaps, marks.
table inet ctr {
    set allowed_ports {
        type inet_service
        flags interval
        elements = { 80, 443, 8000-8100 }
    }

    set trusted4 {
        type ipv4_addr
        flags interval
        elements = { 10.77.0.0/16, 192.168.50.0/24 }
    }

    set svc {
        type ipv4_addr . inet_service
        elements = { 10.88.0.5 . 80, 10.88.0.6 . 5432 }
    }

    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state vmap { established : accept, related : accept, invalid : drop }
        iifname "cni0" meta mark set 0x100
        oifname vmap { "cni0" : jump to_containers, "eth0" : jump from_containers }
        meta mark 0x100 oifname "eth*" accept
    }

    chain to_containers {
        ip daddr . tcp dport @svc accept
        ip saddr @trusted4 goto trusted
        tcp dport @allowed_ports counter accept
        udp dport 53 accept
        ip6 saddr 2001:db8:77::/48 accept
        return
    }

    chain trusted {
        tcp dport 22 drop
        meta mark set 0x7 accept
    }

    chain from_containers {
        iifname != "cni0" return
        meta mark 0x100 ip daddr 10.0.0.0/8 reject with icmp type host-unreachable
        ip6 daddr fd00::/8 drop
        tcp dport != { 80, 443 } meta l4proto tcp reject with tcp reset
        accept
    }

    chain input {
        type filter hook input priority filter; policy accept;
        iifname "cni0" tcp dport 22 drop
        iifname "cni0" udp dport { 53, 67 } accept
        iifname "cni0" jump input_containers
        meta mark 0x42 reject
    }

    chain input_containers {
        meta l4proto { icmp, ipv6-icmp } accept
        reject
    }
}

table ip ctrnat {
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        iifname "eth0" tcp dport 8080 dnat to 10.88.0.5:80
    }

    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "eth0" ip saddr 10.88.0.0/16 masquerade
    }
}
"""


def container_nft():
    out = []
    t = dict(hook="forward", iif="eth0", oif="cni0", src="198.51.100.30", dst="10.88.0.5")
    out += rule(dict(t, proto="tcp", dport=80), port=dict(dport=81), other=dict(dst="10.88.0.6", dport=5432),
                other_miss=dict(dst="10.88.0.6", dport=80), eth1=dict(iif="eth1"))
    out += rule(dict(t, proto="tcp", dst="10.88.0.9", dport=8050), lo=dict(dport=8000), hi=dict(dport=8100),
                miss=dict(dport=8101), udp=dict(proto="udp", dport=53), udp_miss=dict(proto="udp", dport=54))
    out += rule(dict(t, proto="tcp", src="10.77.3.3", dst="10.88.0.9", dport=9999),
                ssh=dict(dport=22), net2=dict(src="192.168.50.1"), miss=dict(src="192.168.51.1"))
    out += rule(dict(t, proto="tcp", src="2001:db8:77::5", dst="fd00:88::5", dport=9999),
                miss=dict(src="2001:db8:78::5"))
    out += rule(dict(t, proto="tcp", dport=8080, dst="203.0.113.1"), port=dict(dport=8081))
    f = dict(hook="forward", iif="cni0", oif="eth0", src="10.88.0.5", dst="198.51.100.30")
    out += rule(dict(f, proto="tcp", dport=443), http=dict(dport=80), other=dict(dport=22),
                udp=dict(proto="udp", dport=53), internal=dict(dst="10.1.2.3"),
                v6=dict(src="fd00:88::5", dst="fd00:1::1", dport=80), v6ok=dict(src="fd00:88::5", dst="2001:db8::1"),
                nomasq=dict(src="10.99.0.5"))
    out += rule(dict(f, oif="eth1", proto="tcp", dport=22), udp=dict(proto="udp"))
    out += rule(dict(hook="forward", iif="eth1", oif="eth0", proto="tcp", src="10.1.1.1", dst="198.51.100.30",
                     dport=80), mark=dict(mark=0x100))
    out += rule(dict(t, proto="tcp", dport=1234, tcp_flags="A", ct="established"), new=dict(ct="new"))
    out += rule(dict(t, proto="icmp", type=3, code=3, ct="related"))
    out += rule(dict(t, proto="tcp", dport=80, tcp_flags="SF", ct="invalid"))
    i = dict(hook="input", iif="cni0", src="10.88.0.5", dst="10.88.0.1")
    out += rule(dict(i, proto="tcp", dport=22), port=dict(dport=23), udp=dict(proto="udp", dport=53),
                dhcp=dict(proto="udp", dport=67), udp_miss=dict(proto="udp", dport=68),
                icmp=dict(proto="icmp"), icmp6=dict(proto="icmpv6", src="fd00:88::5", dst="fd00:88::1"),
                v6=dict(src="fd00:88::5", dst="fd00:88::1", dport=80),
                eth0=dict(iif="eth0", src="198.51.100.30", dst="198.51.100.1", dport=23),
                marked=dict(iif="eth0", src="198.51.100.30", dst="198.51.100.1", dport=23, mark=0x42),
                marked_udp=dict(iif="eth0", proto="udp", src="198.51.100.30", dst="198.51.100.1", dport=23,
                                mark=0x42))
    return out


# ------------------------------------------------------------- scaled rulesets


def scaled_seed001(n):
    """Seed 001's shape: n non-matching port rules ahead of the rules that match."""
    lines = ["# Seed 001 shape scaled to %d rules ahead of the match (generated)." % n,
             "table ip filter {",
             "    chain forward {",
             "        type filter hook forward priority 0; policy drop;",
             '        iifname "eno1" jump forward-from-wan',
             '        iifname "enp2s0" accept',
             "    }",
             "    chain forward-from-wan {"]
    for k in range(n):
        lines.append("        ip daddr 172.16.2.3 tcp dport %d accept" % (10000 + k))
    lines += ["        ip daddr 172.16.2.3 udp dport 5201 accept",
              "        ip daddr 172.16.2.2 icmp type echo-request accept",
              "        tcp dport 5201 reject with tcp reset",
              "    }",
              "}"]
    fw = dict(hook="forward", iif="eno1", oif="enp2s0", src="10.1.0.2", dst="172.16.2.3")
    out = []
    for k in sorted({0, 1, n // 3, n // 2, n - 2, n - 1}):
        out += rule(dict(fw, proto="tcp", dport=10000 + k), dst=dict(dst="172.16.2.4"), udp=dict(proto="udp"))
    out += rule(dict(fw, proto="tcp", dport=10000 + n), below=dict(dport=9999))
    out += rule(dict(fw, proto="udp", dport=5201), tcp=dict(proto="tcp"))
    out += rule(dict(fw, proto="icmp", dst="172.16.2.2"))
    out += rule(dict(hook="forward", iif="enp2s0", oif="eno1", proto="tcp", src="172.16.2.3", dst="10.1.0.2",
                     dport=80))
    return "\n".join(lines) + "\n", out


def classbench(n, seed):
    """ClassBench-style 5-tuple rules (prefixes, port ranges, protocol), random
    verdicts; packets aimed at random rules plus uniformly random packets."""
    rnd = random.Random(seed)
    prefixes = []
    for _ in range(24):
        plen = rnd.choice([8, 12, 16, 20, 24, 28, 32])
        net = ipaddress.ip_network(((10 << 24) | rnd.getrandbits(24), plen), strict=False)
        prefixes.append(net)
    port_ranges = [None, None, (80, 80), (443, 443), (1024, 65535), (0, 1023), (5000, 5100), (53, 53),
                   (8000, 8080), (22, 22)]
    rules = []
    for _ in range(n):
        r = {}
        if rnd.random() < 0.7:
            r["src"] = rnd.choice(prefixes)
        if rnd.random() < 0.7:
            r["dst"] = rnd.choice(prefixes)
        r["proto"] = rnd.choice(["tcp", "udp", "tcp", None])
        if r["proto"]:
            r["sport"] = rnd.choice(port_ranges[:6])
            r["dport"] = rnd.choice(port_ranges)
        r["verdict"] = rnd.choice(["accept", "accept", "drop", "reject", "jump"])
        rules.append(r)
    lines = ["# ClassBench-style 5-tuple ruleset, %d rules, seed %d (generated)." % (n, seed),
             "table ip cb {",
             "    chain forward {",
             "        type filter hook forward priority filter; policy drop;"]
    body = []
    for r in rules:
        parts = []
        if "src" in r:
            parts.append("ip saddr %s" % r["src"])
        if "dst" in r:
            parts.append("ip daddr %s" % r["dst"])
        if r["proto"]:
            if r["sport"]:
                a, b = r["sport"]
                parts.append("%s sport %s" % (r["proto"], a if a == b else "%d-%d" % (a, b)))
            if r["dport"]:
                a, b = r["dport"]
                parts.append("%s dport %s" % (r["proto"], a if a == b else "%d-%d" % (a, b)))
            if not r["sport"] and not r["dport"]:
                parts.append("meta l4proto %s" % r["proto"])
        v = r["verdict"]
        parts.append("jump tagged" if v == "jump" else v)
        body.append("        " + " ".join(parts))
    lines += body
    lines += ["    }",
              "    chain tagged {",
              "        meta mark set 0x5",
              "        udp dport 53 return",
              "        accept",
              "    }",
              "}"]

    def pick(net):
        return str(net.network_address + rnd.randrange(net.num_addresses))

    def port(rg):
        if rg is None:
            return rnd.choice([rnd.randrange(1, 65536), 80, 443, 53, 22, 5050])
        return rnd.randint(rg[0], rg[1])

    out = []
    for _ in range(120):
        r = rnd.choice(rules)
        proto = r["proto"] or rnd.choice(["tcp", "udp"])
        p = dict(hook="forward", iif="eth0", oif="eth1", proto=proto,
                 src=pick(r["src"]) if "src" in r else pick(rnd.choice(prefixes)),
                 dst=pick(r["dst"]) if "dst" in r else pick(rnd.choice(prefixes)),
                 dport=port(r.get("dport")))
        sp = r.get("sport")
        p["sport"] = port(sp) if sp else None
        if p["sport"] is None:
            del p["sport"]
        out.append(pkt(**p))
    for _ in range(30):
        proto = rnd.choice(["tcp", "udp"])
        out.append(pkt(hook="forward", iif="eth0", oif="eth1", proto=proto,
                       src=str(ipaddress.IPv4Address((10 << 24) | rnd.getrandbits(24))),
                       dst=str(ipaddress.IPv4Address((10 << 24) | rnd.getrandbits(24))),
                       dport=rnd.randrange(1, 65536)))
    # unique source port per packet (a sport range rule must still be hit)
    seen = set()
    for p in out:
        if p["src"] == p["dst"]:
            p["dst"] = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address(p["dst"])) ^ 1))
        key = (p["proto"], p["src"], p["dst"], p.get("sport"), p.get("dport"))
        while key in seen:
            p["sport"] = (p["sport"] % 65535) + 1
            key = (p["proto"], p["src"], p["dst"], p.get("sport"), p.get("dport"))
        seen.add(key)
    return "\n".join(lines) + "\n", out


# ------------------------------------------------------------- OpenWrt fw4-style router

OPENWRT_FW4 = """# An OpenWrt fw4-style router rule set (zones lan/wan, syn flood limit,
# reject chains, MSS clamping on the wan zone, masquerade).
table inet fw4 {
	chain input {
		type filter hook input priority filter; policy drop;
		iifname "lo" accept comment "!fw4: Accept traffic from loopback"
		ct state vmap { established : accept, related : accept }
		tcp flags syn / fin,syn,rst,ack jump syn_flood comment "!fw4: Rate limit TCP syn packets"
		iifname "br-lan" jump input_lan comment "!fw4: Handle lan IPv4/IPv6 input traffic"
		iifname "pppoe-wan" jump input_wan comment "!fw4: Handle wan IPv4/IPv6 input traffic"
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state vmap { established : accept, related : accept }
		iifname "br-lan" jump forward_lan
		iifname "pppoe-wan" jump forward_wan
		jump handle_reject
	}
	chain handle_reject {
		meta l4proto tcp reject with tcp reset comment "!fw4: Reject TCP traffic"
		reject comment "!fw4: Reject any other traffic"
	}
	chain syn_flood {
		limit rate 25/second burst 50 packets return comment "!fw4: Accept SYN packets below rate-limit"
		drop comment "!fw4: Drop excess packets"
	}
	chain input_lan {
		ct status dnat accept
		jump accept_from_lan
	}
	chain forward_lan {
		jump accept_to_wan
		jump accept_to_lan
	}
	chain accept_from_lan {
		iifname "br-lan" counter accept
	}
	chain accept_to_lan {
		oifname "br-lan" counter accept
	}
	chain accept_to_wan {
		meta nfproto ipv4 oifname "pppoe-wan" ct state invalid counter drop comment "!fw4: Prevent NAT leakage"
		oifname "pppoe-wan" counter accept
	}
	chain input_wan {
		meta nfproto ipv4 udp dport 68 counter accept comment "!fw4: Allow-DHCP-Renew"
		icmp type echo-request counter accept comment "!fw4: Allow-Ping"
		meta nfproto ipv4 meta l4proto igmp counter accept comment "!fw4: Allow-IGMP"
		meta nfproto ipv6 udp dport 546 counter accept comment "!fw4: Allow-DHCPv6"
		ip6 saddr fe80::/10 icmpv6 type . icmpv6 code { mld-listener-query . no-route, mld-listener-report . no-route } counter accept comment "!fw4: Allow-MLD"
		icmpv6 type { destination-unreachable, time-exceeded, echo-request, echo-reply, nd-router-solicit, nd-router-advert } limit rate 1000/second counter accept comment "!fw4: Allow-ICMPv6-Input"
		jump reject_from_wan
	}
	chain forward_wan {
		icmpv6 type { destination-unreachable, time-exceeded, echo-request, echo-reply } limit rate 1000/second counter accept comment "!fw4: Allow-ICMPv6-Forward"
		meta l4proto esp counter jump accept_to_lan comment "!fw4: Allow-IPSec-ESP"
		ct status dnat accept
		jump reject_to_wan
	}
	chain reject_from_wan {
		iifname "pppoe-wan" counter jump handle_reject
	}
	chain reject_to_wan {
		oifname "pppoe-wan" counter jump handle_reject
	}
	chain dstnat {
		type nat hook prerouting priority dstnat; policy accept;
	}
	chain srcnat {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "pppoe-wan" jump srcnat_wan
	}
	chain srcnat_wan {
		meta nfproto ipv4 masquerade comment "!fw4: Masquerade IPv4 wan traffic"
	}
	chain mangle_forward {
		type filter hook forward priority mangle; policy accept;
		iifname "pppoe-wan" tcp flags syn tcp option maxseg size set rt mtu comment "!fw4: Zone wan IPv4/IPv6 ingress MTU fixing"
		oifname "pppoe-wan" tcp flags syn tcp option maxseg size set rt mtu comment "!fw4: Zone wan IPv4/IPv6 egress MTU fixing"
	}
}
"""


def openwrt_fw4():
    lan = dict(hook="forward", iif="br-lan", oif="pppoe-wan", src="192.168.1.20", dst="198.51.100.7")
    wan = dict(hook="forward", iif="pppoe-wan", oif="br-lan", src="198.51.100.7", dst="192.168.1.20")
    lan6 = dict(lan, src="2001:db8:1::20", dst="2001:db8:ff::7")
    wan6 = dict(wan, src="2001:db8:ff::7", dst="2001:db8:1::20")
    out = []
    out += rule(dict(lan, proto="tcp", dport=443), udp=dict(proto="udp", dport=53), icmp=dict(proto="icmp"),
                v6=dict(lan6, proto="tcp", dport=443), invalid=dict(tcp_flags="SF", ct="invalid"), ack=dict(tcp_flags="A"))
    out += rule(dict(wan, proto="tcp", dport=22), udp=dict(proto="udp", dport=5000),
                est=dict(tcp_flags="A", ct="established"), v6=dict(wan6, proto="tcp", dport=22))
    out += rule(dict(wan6, proto="icmpv6", type=128), v4=dict(wan, proto="icmp", type=8))
    out += rule(dict(wan, proto="udp", dport=5001, ct="established"))
    iw = dict(hook="input", iif="pppoe-wan", src="198.51.100.7", dst="203.0.113.2")
    iw6 = dict(hook="input", iif="pppoe-wan", src="2001:db8:ff::7", dst="2001:db8:1::1")
    out += rule(dict(iw, proto="udp", dport=68), miss=dict(dport=69), icmp=dict(proto="icmp", type=8),
                tcp=dict(proto="tcp", dport=22), v6=dict(iw6, proto="udp", dport=546),
                echo6=dict(iw6, proto="icmpv6", type=128))
    il = dict(hook="input", iif="br-lan", src="192.168.1.20", dst="192.168.1.1")
    out += rule(dict(il, proto="tcp", dport=22), udp=dict(proto="udp", dport=53),
                ack=dict(tcp_flags="A"), est=dict(tcp_flags="A", ct="established"))
    return out


# ------------------------------------------------------------- IP header and meta fields

HEADER_FIELDS = """# IP header and meta fields: TTL / hop limit (the forward hook sees them
# decremented), lengths, DSCP, meta pkttype, fib address types.
table inet hdr {
    chain hdr_pre {
        type filter hook prerouting priority raw; policy accept;
        fib saddr . iif oif missing drop
        fib saddr oif missing drop
    }
    chain hdr_fwd {
        type filter hook forward priority filter; policy accept;
        ip ttl 7 drop
        ip6 hoplimit 7 drop
        ip length > 1000 drop
        ip6 length > 1000 drop
        meta length 300-400 reject
        ip dscp ef meta mark set 0x2e
        ip dscp { cs1, af41 } drop
        ip6 dscp ef meta mark set 0x2f
        fib daddr type local drop
        fib saddr type { local, broadcast, multicast } drop
        ether saddr { 02:00:00:00:be:ef, 02:00:00:00:be:f0 } reject
        ether saddr 02:00:00:00:be:f1 meta mark set 0x21
    }
    chain hdr_in {
        type filter hook input priority filter; policy accept;
        meta pkttype broadcast drop
        ip ttl < 3 drop
        ip6 hoplimit < 3 drop
        ip dscp cs6 drop
        fib daddr type != local drop
        fib daddr type local fib saddr type unicast meta mark set 0x7
        udp dport 5003 ct mark set 0x11 meta mark set ct mark
        udp dport 5004 meta mark set 0x12 ct mark set meta mark meta mark set 0x13 meta mark set ct mark
    }
}
"""


def header_fields():
    fw = dict(hook="forward", iif="eth0", oif="eth1", src="10.0.0.5", dst="192.0.2.80")
    fw6 = dict(hook="forward", iif="eth0", oif="eth1", src="2001:db8::5", dst="2001:db8:2::80")
    out = []
    out += rule(dict(fw, proto="udp", dport=53, ttl=8), above=dict(ttl=9), at=dict(ttl=7))
    out += rule(dict(fw6, proto="udp", dport=53, ttl=8), above=dict(ttl=9))
    out += rule(dict(fw, proto="udp", dport=80, length=1200), short=dict(length=1000),
                tcp=dict(proto="tcp", length=1001))
    out += rule(dict(fw6, proto="udp", dport=80, length=1100), short=dict(length=1040))
    out += rule(dict(fw, proto="udp", dport=81, length=350), low=dict(length=299), high=dict(length=401),
                lo=dict(length=300), hi=dict(length=400), v6=dict(src="2001:db8::5", dst="2001:db8:2::80"))
    out += rule(dict(fw, proto="tcp", dport=443, dscp=46), be=dict(dscp=0), af41=dict(dscp=34),
                cs1=dict(dscp=8), cs2=dict(dscp=16))
    out += rule(dict(fw6, proto="tcp", dport=443, dscp=46), be=dict(dscp=0), cs1=dict(dscp=8))
    inp = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1")
    inp6 = dict(hook="input", iif="eth0", src="2001:db8::5", dst="2001:db8::1")
    out += rule(dict(inp, proto="udp", dport=5000, pkttype="broadcast"), host=dict(pkttype="host"),
                multicast=dict(pkttype="multicast"))
    out += rule(dict(inp, proto="udp", dport=5001, ttl=2), ttl=dict(ttl=3), dscp=dict(dscp=48),
                v6=dict(src="2001:db8::5", dst="2001:db8::1"))
    out += rule(dict(inp6, proto="udp", dport=5002, ttl=2), ttl=dict(ttl=3))
    # The peer's frames come from 02:5c:00:00:00:02 (eth0's peer).
    out += rule(dict(fw, proto="udp", dport=5005, ether_saddr="02:00:00:00:be:ef"),
                other=dict(ether_saddr="02:00:00:00:be:f1"), own=dict(ether_saddr="02:5c:00:00:00:02"),
                v6=dict(fw6, proto="udp", dport=5005, ether_saddr="02:00:00:00:be:f0"))
    out += rule(dict(inp, proto="udp", dport=5003), other=dict(dport=5004),
                v6=dict(src="2001:db8::5", dst="2001:db8::1"))
    return out


DYNAMIC_SETS = """# Sets the packet path fills (nft dynset): a deny list fed by probes of
# closed ports, port knocking with a constant in the key, a per-source
# meter, a set of two at most, and a delete. The packets are sent in order,
# so each one sees what the ones before it added.
table inet dyn {
    set deny { type ipv4_addr; flags dynamic,timeout; timeout 1h; elements = { 10.0.0.66 } }
    set deny6 { type ipv6_addr; flags dynamic,timeout; timeout 1h; }
    set knock { type ipv4_addr . inet_service; flags timeout; }
    set clients { type ipv4_addr; flags timeout; }
    set metered { type ipv4_addr; flags dynamic; }
    set pairs { typeof ip saddr . tcp dport; flags dynamic; size 2; }
    chain dyn_in {
        type filter hook input priority filter; policy accept;
        ip saddr @deny drop
        ip6 saddr @deny6 drop
        tcp dport { 23, 3389 } update @deny { ip saddr } drop
        tcp dport 23 update @deny6 { ip6 saddr } drop
        tcp dport 7001 add @knock { ip saddr . 7002 timeout 5s } drop
        tcp dport 7002 ip saddr . tcp dport @knock add @clients { ip saddr timeout 10s } drop
        tcp dport 2222 ip saddr @clients accept
        tcp dport 2222 drop
        tcp dport 8001 delete @clients { ip saddr } accept
        udp dport 5353 add @metered { ip saddr limit rate over 2/minute burst 1 packets } drop
        udp dport 5353 accept
        tcp dport 8000 add @pairs { ip saddr . tcp dport } accept
        tcp dport 8000 reject
        ip saddr != @deny udp dport 9000 meta mark set 0x9
    }
}
"""


def dynamic_sets():
    inp = dict(hook="input", iif="eth0", dst="10.0.0.1")
    inp6 = dict(hook="input", iif="eth0", dst="2001:db8::1")

    def p(src, proto, dport, **kw):
        return pkt(**dict(inp6 if ":" in src else inp, src=src, proto=proto, dport=dport, **kw))

    a, b = "10.0.0.5", "10.0.0.6"
    out = [p(a, "tcp", 2222), p(a, "tcp", 7002), p(a, "tcp", 2222),   # no knock yet
           p(a, "tcp", 7001), p(a, "tcp", 7002), p(a, "tcp", 2222),   # knocked: accept
           p(b, "tcp", 2222),                                         # another source
           p(a, "tcp", 8001), p(a, "tcp", 2222)]                      # deleted again
    out += [p("10.0.0.7", "udp", 5353) for _ in range(4)]             # 3 pass, then over
    out += [p("10.0.0.8", "udp", 5353)]
    out += [p("10.0.0.9", "tcp", 8000), p("10.0.0.10", "tcp", 8000),
            p("10.0.0.11", "tcp", 8000), p("10.0.0.9", "tcp", 8000)]  # size 2: the third is rejected
    out += [p("10.0.0.12", "udp", 9000), p("10.0.0.12", "tcp", 3389),
            p("10.0.0.12", "udp", 9000), p("10.0.0.66", "udp", 9000)]
    out += [p("2001:db8::5", "udp", 9000), p("2001:db8::5", "tcp", 23),
            p("2001:db8::5", "udp", 9000), p("2001:db8::6", "udp", 9000)]
    return out


HASHLIMIT_RULES = """# iptables -m hashlimit (per-key token buckets), which Sluice reads as
# dynamic sets with a limit per element, as iptables-translate writes it.
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp --dport 22 -m conntrack --ctstate NEW -m hashlimit --hashlimit-above 1/min --hashlimit-burst 3 --hashlimit-mode srcip --hashlimit-name ssh -j DROP
-A INPUT -p tcp --dport 22 -j ACCEPT
-A INPUT -p udp -m hashlimit --hashlimit-upto 1/min --hashlimit-burst 2 --hashlimit-mode srcip,dstport --hashlimit-name dns -j ACCEPT
-A INPUT -p udp -j DROP
COMMIT
"""


def hashlimit():
    inp = dict(hook="input", iif="eth0", dst="10.0.0.1")
    out = [pkt(**dict(inp, src="10.0.0.5", proto="tcp", dport=22)) for _ in range(4)]
    out += [pkt(**dict(inp, src="10.0.0.6", proto="tcp", dport=22))]
    out += [pkt(**dict(inp, src="10.0.0.5", proto="udp", dport=53)) for _ in range(3)]
    out += [pkt(**dict(inp, src="10.0.0.5", proto="udp", dport=54)),
            pkt(**dict(inp, src="10.0.0.6", proto="udp", dport=53))]
    return out


HOST6_RULES6 = """# Generated by ip6tables-save v1.8.9 (nf_tables): an IPv6 host and router
# firewall, loaded with ip6tables-restore (Sluice: sluice check --format
# ip6tables, or detected from this header).
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:ICMP6 - [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p ipv6-icmp -j ICMP6
-A INPUT -s fe80::/10 -p udp -m udp --dport 546 -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -m hashlimit --hashlimit-above 1/min --hashlimit-burst 2 --hashlimit-mode srcip --hashlimit-name ssh6 -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -s 2001:db8:bad::/48 -j DROP
-A INPUT -d 2001:db8::1/128 -p tcp -m multiport --dports 80,443 -j ACCEPT
-A INPUT -p tcp -j REJECT --reject-with tcp-reset
-A INPUT -j REJECT --reject-with icmp6-adm-prohibited
-A ICMP6 -p ipv6-icmp -m icmp6 --icmpv6-type echo-request -j ACCEPT
-A ICMP6 -p ipv6-icmp -m icmp6 --icmpv6-type 1/4 -j ACCEPT
-A ICMP6 -p ipv6-icmp -m icmp6 --icmpv6-type packet-too-big -j ACCEPT
-A ICMP6 -j RETURN
-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -i eth0 -o eth1 -p tcp -m multiport --dports 80,443 -j ACCEPT
-A FORWARD -i eth0 -o eth1 -p udp --dport 53 -j ACCEPT
-A FORWARD -i eth1 -o eth0 -p ipv6-icmp -m icmp6 --icmpv6-type echo-request -j ACCEPT
-A FORWARD -i eth1 -j REJECT --reject-with icmp6-adm-prohibited
COMMIT
"""


def host6():
    inp = dict(hook="input", iif="eth0", dst="2001:db8::1")
    fw = dict(hook="forward", iif="eth0", oif="eth1", src="2001:db8:1::5", dst="2001:db8:2::80")
    back = dict(hook="forward", iif="eth1", oif="eth0", src="2001:db8:2::80", dst="2001:db8:1::5")
    out = []
    out += rule(dict(inp, src="2001:db8:1::5", proto="icmpv6", type=128),
                # Without a connection the kernel calls these invalid.
                reply=dict(type=129, ct="invalid"), unreach=dict(type=1, code=4, ct="invalid"),
                admin=dict(type=1, code=1, ct="invalid"), ptb=dict(type=2, ct="invalid"))
    out += [pkt(**dict(inp, src="2001:db8:1::7", proto="tcp", dport=22)) for _ in range(3)]
    out += [pkt(**dict(inp, src="2001:db8:1::8", proto="tcp", dport=22))]
    out += rule(dict(inp, src="2001:db8:1::5", proto="tcp", dport=443), other=dict(dport=8443),
                bad=dict(src="2001:db8:bad::1"), udp=dict(proto="udp", dport=443))
    out += rule(dict(fw, proto="tcp", dport=80), other=dict(dport=81), udp=dict(proto="udp", dport=53),
                udp2=dict(proto="udp", dport=54))
    out += rule(dict(back, proto="icmpv6", type=128), tcp=dict(proto="tcp", dport=22))
    return out


QUOTA_NFT = """# Byte quotas (nft_quota): every packet adds its length (the IP total
# length) before the check; a packet that uses up exactly the rest of a
# quota is still within it.
table inet q {
    chain q_in {
        type filter hook input priority filter; policy accept;
        udp dport 7000 quota over 200 bytes drop
        udp dport 7001 quota 100 bytes accept
        udp dport 7001 drop
        udp dport 7002 quota until 1 kbytes used 900 bytes meta mark set 0x7
    }
}
"""


def quota():
    inp = dict(hook="input", iif="eth0", dst="10.0.0.1", src="10.0.0.5", proto="udp", length=100)
    out = [pkt(**dict(inp, dport=7000)) for _ in range(3)]
    out += [pkt(**dict(inp, dport=7001)) for _ in range(2)]
    out += [pkt(**dict(inp, dport=7002, length=124)), pkt(**dict(inp, dport=7002, length=20 + 8))]
    return out


MARK_OPS_NFT = """# Marks changed bit by bit: meta mark set meta mark & | ^ (and, or, xor).
table inet mk {
    chain mk_fwd {
        type filter hook forward priority filter; policy accept;
        udp dport 6000 meta mark set meta mark | 0x4000
        udp dport 6001 meta mark set meta mark & 0xff00
        udp dport 6002 meta mark set meta mark ^ 0x1
        udp dport 6003 meta mark set meta mark & 0xffff0000 | 0x5
        udp dport 6004 meta mark set meta mark and 0xf0 xor 0x3
        udp dport 6005 meta mark set mark or 0x80000000
    }
}
"""

MARK_OPS_RULES = """# xt_MARK's mark changes, as kube-proxy and policy routers write them.
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A FORWARD -p udp --dport 6000 -j MARK --set-xmark 0x4000/0x4000
-A FORWARD -p udp --dport 6001 -j MARK --set-mark 0x100/0xff00
-A FORWARD -p udp --dport 6002 -j MARK --xor-mark 0x1
-A FORWARD -p udp --dport 6003 -j MARK --and-mark 0xff00
-A FORWARD -p udp --dport 6004 -j MARK --or-mark 0x10000
-A FORWARD -p udp --dport 6005 -j MARK --set-xmark 0x4000/0x0
-A FORWARD -p udp --dport 6006 -j MARK --set-mark 0x7
COMMIT
"""


def mark_ops(n):
    fw = dict(hook="forward", iif="eth0", oif="eth1", src="10.0.0.5", dst="192.0.2.80", proto="udp")
    out = []
    for port in range(6000, 6000 + n):
        for m in (0x12345678, 0, 0xffffffff):
            out.append(pkt(**dict(fw, dport=port, mark=m)))
    return out


MATCH_MODULES_RULES = """# iptables match modules that map onto nft fields one to one: iprange,
# length, ttl, pkttype, dscp; and the NFLOG target.
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p udp --dport 5100 -m iprange --src-range 10.0.0.10-10.0.0.20 -j DROP
-A INPUT -p udp --dport 5101 -m length --length 200:300 -j DROP
-A INPUT -p udp --dport 5102 -m ttl --ttl-lt 5 -j DROP
-A INPUT -p udp --dport 5102 -m ttl --ttl-gt 200 -j REJECT
-A INPUT -p udp --dport 5103 -m pkttype --pkt-type broadcast -j DROP
-A INPUT -p udp --dport 5104 -m dscp --dscp-class EF -j DROP
-A INPUT -p udp --dport 5104 -m dscp --dscp 10 -j REJECT
-A INPUT -p udp --dport 5105 -j NFLOG --nflog-group 3
-A INPUT -p udp --dport 5105 -m ttl ! --ttl-eq 64 -j DROP
COMMIT
"""


def match_modules():
    inp = dict(hook="input", iif="eth0", src="10.0.0.15", dst="10.0.0.1", proto="udp")
    out = []
    out += rule(dict(inp, dport=5100), outside=dict(src="10.0.0.25"), edge=dict(src="10.0.0.20"))
    out += rule(dict(inp, dport=5101, length=250), short=dict(length=100), top=dict(length=300))
    out += rule(dict(inp, dport=5102, ttl=3), ttl64=dict(ttl=64), high=dict(ttl=250), five=dict(ttl=5))
    out += rule(dict(inp, dport=5103, pkttype="broadcast"), host=dict(pkttype="host"))
    out += rule(dict(inp, dport=5104, dscp=46), af11=dict(dscp=10), be=dict(dscp=0))
    out += rule(dict(inp, dport=5105, ttl=63), ttl64=dict(ttl=64))
    return out


CONNLIMIT_NFT = """# ct count in dynamic sets' elements (nft_connlimit): open connections
# per key, the packet's own included.
table inet cl {
    set per_src { type ipv4_addr; flags dynamic; }
    set per_dst { type ipv4_addr; flags dynamic; }
    set per_src6 { type ipv6_addr; flags dynamic; }
    chain cl_fwd {
        type filter hook forward priority filter; policy accept;
        tcp dport 22 add @per_src { ip saddr ct count over 2 } drop
        tcp dport 80 add @per_dst { ip daddr ct count 1 } accept
        tcp dport 80 drop
        tcp dport 22 add @per_src6 { ip6 saddr ct count over 1 } drop
        udp dport 53 add @per_src { ip saddr ct count over 1 } drop
        udp dport 54 update @lim { ip saddr limit rate over 1/hour burst 1 packets } drop
        tcp dport 25 ct count over 2 drop
    }
    # An element the rule set declares has no limit of its own: the
    # statement's limit applies only to the elements it creates.
    set lim { type ipv4_addr; flags dynamic; elements = { 10.0.1.9 } }
}
"""

CONNLIMIT_RULES = """# xt_connlimit, which Sluice reads as iptables-translate writes it: a
# dynamic set per rule with a ct count per element.
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p tcp --dport 22 -m connlimit --connlimit-above 2 -j DROP
-A FORWARD -p tcp --dport 80 -m connlimit --connlimit-upto 1 --connlimit-daddr -j ACCEPT
-A FORWARD -p tcp --dport 80 -j DROP
-A FORWARD -p udp --dport 53 -m connlimit ! --connlimit-above 1 -j ACCEPT
-A FORWARD -p udp --dport 53 -j DROP
COMMIT
"""


def connlimit(v6=True):
    """New connections counted per key; one packet over each limit (a
    dropped first packet still counts for a moment in the kernel)."""
    fw = dict(hook="forward", iif="eth0", oif="eth1", dst="192.0.2.80")
    out = [pkt(**dict(fw, src="10.0.1.5", proto="tcp", dport=22)) for _ in range(3)]
    out += [pkt(**dict(fw, src="10.0.1.6", proto="tcp", dport=22))]
    # An established connection met by the rule counts too.
    out += [pkt(**dict(fw, src="10.0.1.7", proto="tcp", dport=22, ct="established", tcp_flags="A"))]
    out += [pkt(**dict(fw, src="10.0.1.7", proto="tcp", dport=22)) for _ in range(2)]
    out += [pkt(**dict(fw, src="10.0.1.5", dst="192.0.2.81", proto="tcp", dport=80)) for _ in range(2)]
    out += [pkt(**dict(fw, src="10.0.1.6", dst="192.0.2.82", proto="tcp", dport=80))]
    out += [pkt(**dict(fw, src="10.0.1.8", proto="udp", dport=53)) for _ in range(2)]
    if v6:
        fw6 = dict(fw, dst="2001:db8:2::80")
        out += [pkt(**dict(fw6, src="2001:db8:1::5", proto="tcp", dport=22)) for _ in range(2)]
        # The TCP connection of 10.0.1.6 already counts: udp 53 is its second.
        out += [pkt(**dict(fw, src="10.0.1.6", proto="udp", dport=53))]
        out += [pkt(**dict(fw, src=s, proto="udp", dport=54)) for s in ("10.0.1.9", "10.0.1.10") for _ in range(3)]
        # A rule's own count: every source together.
        out += [pkt(**dict(fw, src=s, proto="tcp", dport=25)) for s in ("10.0.1.11", "10.0.1.12", "10.0.1.13")]
    return out


NUMGEN_NFT = """# numgen: a counter per rule (inc) and random numbers, compared with a
# value, a range or a set.
table inet ng {
    chain ng_fwd {
        type filter hook forward priority filter; policy accept;
        udp dport 7100 numgen inc mod 3 0 drop
        udp dport 7101 numgen inc mod 4 offset 10 { 11, 13 } drop
        udp dport 7102 numgen inc mod 2 != 1 drop
        udp dport 7103 numgen random mod 100 > 99 drop
        udp dport 7104 numgen random mod 100 0-99 drop
    }
}
"""

STATISTIC_RULES = """# xt_statistic, which Sluice reads as numgen: nth (a counter per rule,
# starting at --packet) and random with probabilities 1 and 0.
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p udp --dport 7110 -m statistic --mode nth --every 3 --packet 0 -j DROP
-A FORWARD -p udp --dport 7111 -m statistic --mode nth --every 3 --packet 2 -j DROP
-A FORWARD -p udp --dport 7112 -m statistic --mode nth ! --every 2 --packet 0 -j DROP
-A FORWARD -p udp --dport 7113 -m statistic --mode random --probability 1.0 -j DROP
-A FORWARD -p udp --dport 7114 -m statistic --mode random --probability 0.0 -j DROP
COMMIT
"""


def numgen(ports, counts):
    fw = dict(hook="forward", iif="eth0", oif="eth1", src="10.0.2.5", dst="192.0.2.80", proto="udp")
    out = []
    for port, n in zip(ports, counts):
        out += [pkt(**dict(fw, dport=port)) for _ in range(n)]
    return out


ELEM_QUOTA_NFT = """# quota in dynamic sets' elements: a byte quota per key (per source
# here), from the quota's used bytes when the element is created.
table inet equota {
    set per_src { type ipv4_addr; flags dynamic; }
    set per_src2 { type ipv4_addr; flags dynamic; }
    chain equota_in {
        type filter hook input priority filter; policy accept;
        udp dport 7200 add @per_src { ip saddr quota over 200 bytes } drop
        udp dport 7201 add @per_src2 { ip saddr quota until 250 bytes used 40 bytes } accept
        udp dport 7201 drop
    }
}
"""


def elem_quota():
    inp = dict(hook="input", iif="eth0", dst="10.0.0.1", proto="udp", length=100)
    out = [pkt(**dict(inp, src="10.0.0.5", dport=7200)) for _ in range(3)]
    out += [pkt(**dict(inp, src="10.0.0.6", dport=7200))]
    out += [pkt(**dict(inp, src="10.0.0.5", dport=7201)) for _ in range(3)]
    out += [pkt(**dict(inp, src="10.0.0.6", dport=7201))]
    return out


NAMED_OBJECTS_NFT = """# Named counters and quotas: one quota object shared by two rules (its
# bytes are used up by either port's packets), a quota until, a counter
# before a quota (counted whatever the quota says).
table inet objs {
    counter seen { }
    quota shared { over 250 bytes }
    quota small { 150 bytes used 20 bytes }
    chain objs_in {
        type filter hook input priority filter; policy accept;
        udp dport 7300 counter name "seen" quota name "shared" drop
        udp dport 7301 quota name "shared" drop
        udp dport 7302 quota name "small" accept
        udp dport 7302 drop
    }
}
"""


def named_objects():
    inp = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1", proto="udp", length=100)
    # 7300 and 7301 share `shared`: 100, 200 within; 300 over.
    out = [pkt(**dict(inp, dport=7300)), pkt(**dict(inp, dport=7301))]
    out += [pkt(**dict(inp, dport=7301)), pkt(**dict(inp, dport=7300))]
    # `small` from 20 used: 120 within, 220 not.
    out += [pkt(**dict(inp, dport=7302)) for _ in range(3)]
    return out


TIME_MATCHES_NFT = """# meta time / day / hour: the kernel reads its clock when the packet
# arrives, the trace its own; every rule here decides the same way at any
# moment after 2020 (before 2099), so the two agree whenever they run.
table inet clock {
    chain clock_in {
        type filter hook input priority filter; policy accept;
        udp dport 7400 meta time < "2020-01-01" drop
        udp dport 7400 meta time >= "2020-01-01 00:00:00" counter accept
        udp dport 7401 meta hour "00:00"-"23:59:59" drop
        udp dport 7402 meta day { "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday" } drop
        udp dport 7403 meta day != 0-6 drop
        udp dport 7404 meta hour "22:00"-"06:00" meta hour "06:00:01"-"21:59:59" drop
        udp dport 7405 meta time > "2099-01-01" drop
        udp dport 7406 meta day "Monday"-"Friday" accept
        udp dport 7406 meta day { "Saturday", "Sunday" } accept
        udp dport 7406 drop
    }
}
"""


def time_matches():
    inp = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1", proto="udp")
    return [pkt(**dict(inp, dport=p)) for p in range(7400, 7407)]


TIME_XT_RULES = """# xt_time (iptables -m time), which Sluice reads as meta time / day /
# hour: every rule decides the same way at any moment from 2020 to 2038.
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p udp --dport 7500 -m time --datestop 2019-12-31T23:59:59 -j DROP
-A FORWARD -p udp --dport 7500 -m time --datestart 2020-01-01 --datestop 2038-01-01 -j ACCEPT
-A FORWARD -p udp --dport 7500 -j DROP
-A FORWARD -p udp --dport 7501 -m time --timestart 00:00 --timestop 23:59:59 -j DROP
-A FORWARD -p udp --dport 7502 -m time --timestart 12:00 --timestop 11:59:59 -j DROP
-A FORWARD -p udp --dport 7503 -m time --weekdays Mon,Tue,Wed,Thu,Fri,Sat,Sun -j DROP
-A FORWARD -p udp --dport 7504 -m time ! --weekdays Mon,Tue,Wed,Thu,Fri -m time --weekdays Mon,Tue,Wed,Thu,Fri -j DROP
-A FORWARD -p udp --dport 7505 -m time --timestart 06:00 --timestop 05:59:59 --utc -j DROP
COMMIT
"""


OBJECT_MAPS_NFT = """# Object maps: the quota or counter a packet's source maps to; a source
# the map does not hold ends the rule. A named limit named by two rules.
table inet omaps {
    quota qa { over 150 bytes }
    quota qb { over 150 bytes }
    counter ca { }
    limit shared { rate 1/minute burst 2 packets }
    map caps { type ipv4_addr : quota; elements = { 10.0.0.5 : "qa", 10.0.0.6 : "qb" } }
    chain omaps_in {
        type filter hook input priority filter; policy accept;
        udp dport 7600 quota name ip saddr map @caps drop
        udp dport 7601 counter name ip saddr map { 10.0.0.5 : "ca" } drop
        udp dport 7602 limit name "shared" accept
        udp dport 7603 limit name "shared" accept
        udp dport { 7602, 7603 } drop
    }
}
"""


def object_maps():
    inp = dict(hook="input", iif="eth0", dst="10.0.0.1", proto="udp", length=100)
    out = [pkt(**dict(inp, src="10.0.0.5", dport=7600)) for _ in range(2)]
    out += [pkt(**dict(inp, src=s, dport=7600)) for s in ("10.0.0.6", "10.0.0.7")]
    out += [pkt(**dict(inp, src=s, dport=7601)) for s in ("10.0.0.5", "10.0.0.7")]
    # Within the shared burst only: a trace's limits never run out (the
    # sharing is checked by the policy's tests).
    out += [pkt(**dict(inp, src="10.0.0.5", dport=p)) for p in (7602, 7603)]
    return out

NOTRACK_NFT = """# notrack before conntrack (priority raw): untracked packets are never
# translated, later chains see ct state untracked, ct mark needs a
# connection, a drop before conntrack is final and a mark set there carries.
table ip raw {
    chain pre {
        type filter hook prerouting priority raw; policy accept;
        iifname "eth0" ip saddr 10.66.0.0/16 drop
        udp dport 5300 notrack
        udp dport 5301 notrack meta mark set 0x11
        ct state invalid udp dport 5302 meta mark set 0x22
        tcp dport 5303 notrack
        udp dport 5304 notrack
        udp dport 5305 notrack
        ct state untracked udp dport 5306 drop
    }
}
table ip filter {
    chain forward_filter {
        type filter hook forward priority filter; policy drop;
        ct state untracked udp dport 5300 accept
        ct state untracked meta mark 0x11 accept
        ct state untracked tcp dport 5303 accept
        udp dport 5304 ct mark 0 accept
        ct state new udp dport 5302 meta mark 0x22 accept
        ct state new udp dport 5306 accept
        ct state new accept
    }
    chain input_filter {
        type filter hook input priority filter; policy accept;
        ct state untracked udp dport 5305 drop
        ct state untracked accept
    }
}
table ip nat {
    chain post {
        type nat hook postrouting priority srcnat;
        oifname "eth1" masquerade
    }
}
"""


def notrack():
    fwd = dict(hook="forward", iif="eth0", oif="eth1", src="10.0.0.5", dst="198.51.100.7", proto="udp")
    out = []
    # untracked and accepted: no masquerade
    out += rule(dict(fwd, dport=5300), tracked=dict(dport=5399))
    out += rule(dict(fwd, dport=5301))
    out += rule(dict(fwd, dport=5302), spoofed=dict(src="10.66.3.4"))
    out += rule(dict(fwd, proto="tcp", dport=5303), udp=dict(proto="udp"))
    # `ct mark 0` needs a connection: the untracked packet falls to the
    # policy (drop)
    out += rule(dict(fwd, dport=5304))
    out += rule(dict(fwd, dport=5306))
    inp = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1", proto="udp")
    out += rule(dict(inp, dport=5305), other=dict(dport=5300))
    return out

CT_TUPLE_NFT = """# ct original / ct reply addresses: the original tuple before NAT, the
# reply tuple with a DNAT's target as its source; established packets read
# their connection's tuples.
table ip nat {
    chain pre {
        type nat hook prerouting priority dstnat; policy accept;
        iifname "ppp0" tcp dport 8080 dnat to 192.168.1.10:80
    }
}
table ip filter {
    chain forward_filter {
        type filter hook forward priority filter; policy drop;
        ct original ip daddr 203.0.113.1 ct reply ip saddr 192.168.1.10 accept
        ct original ip saddr 10.0.0.0/8 ct reply ip daddr 10.0.0.0/8 accept
        ct state established ct original ip saddr 192.168.1.50 ct reply ip saddr 198.51.100.50 accept
        ct reply ip saddr 198.51.100.60 drop
        ct original ip daddr != 198.51.100.0/24 accept
    }
}
"""


def ct_tuple():
    wan = dict(hook="forward", iif="ppp0", oif="br-lan", src="198.51.100.50", dst="203.0.113.1", proto="tcp")
    lan = dict(hook="forward", iif="br-lan", oif="ppp0", src="192.168.1.50", dst="198.51.100.50", proto="tcp")
    out = []
    out += rule(dict(wan, dport=8080), nodnat=dict(dport=8081))
    out += rule(dict(lan, src="10.1.2.3", dport=443), other=dict(src="172.16.0.9"))
    out += rule(dict(lan, dport=51000, tcp_flags="A", ct="established"), new=dict(ct="new"))
    out += rule(dict(lan, dst="198.51.100.60", dport=80), elsewhere=dict(dst="192.0.2.8"))
    return out

CT_TUPLE_XT_RULES = """# iptables -m conntrack tuple and status options (ct_tuple.nft's rules).
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -i ppp0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 192.168.1.10:80
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctorigdst 203.0.113.1 --ctreplsrc 192.168.1.10 -j ACCEPT
-A FORWARD -m conntrack --ctorigsrc 10.0.0.0/8 --ctrepldst 10.0.0.0/8 -j ACCEPT
-A FORWARD -m conntrack --ctstate ESTABLISHED -m conntrack --ctorigsrc 192.168.1.50 --ctreplsrc 198.51.100.50 -j ACCEPT
-A FORWARD -m conntrack --ctreplsrc 198.51.100.60 -j DROP
-A FORWARD -m conntrack ! --ctorigdst 198.51.100.0/24 -j ACCEPT
COMMIT
"""

FRAG_OFF_NFT = """# ip frag-off: every chain from defragmentation (-400) on sees the
# packet whole: offset 0, MF clear (the oracle's packets have DF clear).
table ip filter {
    chain input_filter {
        type filter hook input priority filter; policy accept;
        ip frag-off & 0x1fff != 0 udp dport 5500 drop
        ip frag-off & 0x4000 != 0 udp dport 5501 drop
        ip frag-off 0 udp dport 5502 drop
        ip frag-off != 0 udp dport 5503 drop
    }
    chain pre_raw {
        type filter hook prerouting priority raw; policy accept;
        ip frag-off & 0x2000 != 0 udp dport 5504 drop
        ip frag-off & 0x3fff == 0 udp dport 5505 drop
    }
}
"""


def frag_off():
    inp = dict(hook="input", iif="eth0", src="10.0.0.5", dst="10.0.0.1", proto="udp")
    return [pkt(**dict(inp, dport=p)) for p in range(5500, 5506)]


def main():
    seed_pk = seed001()
    for name in ("seed001_appendix_b", "seed001_appendix_c", "seed001_appendix_d", "seed001_appendix_e"):
        write(name, seed_pk)
    write("host_firewall", host_firewall())
    write("router_nat", router_nat())
    write("container_host", container_host())
    with open(os.path.join(HERE, "port_forward.nft"), "w") as f:
        f.write(PORT_FORWARD)
    write("port_forward", port_forward())
    with open(os.path.join(HERE, "container_nft.nft"), "w") as f:
        f.write(CONTAINER_NFT)
    write("container_nft", container_nft())
    for n in (20, 1000, 10000):
        text, pk = scaled_seed001(n)
        with open(os.path.join(HERE, "scaled_seed001_%d.nft" % n), "w") as f:
            f.write(text)
        write("scaled_seed001_%d" % n, pk)
    for n, seed in ((100, 1), (2000, 2)):
        text, pk = classbench(n, seed)
        with open(os.path.join(HERE, "classbench_%d.nft" % n), "w") as f:
            f.write(text)
        write("classbench_%d" % n, pk)
    # Last, so that the source ports of the rulesets above stay as they were.
    with open(os.path.join(HERE, "header_fields.nft"), "w") as f:
        f.write(HEADER_FIELDS)
    write("header_fields", header_fields())
    with open(os.path.join(HERE, "openwrt_fw4.nft"), "w") as f:
        f.write(OPENWRT_FW4)
    write("openwrt_fw4", openwrt_fw4())
    with open(os.path.join(HERE, "dynamic_sets.nft"), "w") as f:
        f.write(DYNAMIC_SETS)
    write("dynamic_sets", dynamic_sets())
    with open(os.path.join(HERE, "hashlimit.rules"), "w") as f:
        f.write(HASHLIMIT_RULES)
    write("hashlimit", hashlimit())
    with open(os.path.join(HERE, "host6.rules6"), "w") as f:
        f.write(HOST6_RULES6)
    write("host6", host6())
    with open(os.path.join(HERE, "quota.nft"), "w") as f:
        f.write(QUOTA_NFT)
    write("quota", quota())
    with open(os.path.join(HERE, "mark_ops.nft"), "w") as f:
        f.write(MARK_OPS_NFT)
    write("mark_ops", mark_ops(6))
    with open(os.path.join(HERE, "mark_ops_xt.rules"), "w") as f:
        f.write(MARK_OPS_RULES)
    write("mark_ops_xt", mark_ops(7))
    with open(os.path.join(HERE, "match_modules.rules"), "w") as f:
        f.write(MATCH_MODULES_RULES)
    write("match_modules", match_modules())
    with open(os.path.join(HERE, "connlimit.nft"), "w") as f:
        f.write(CONNLIMIT_NFT)
    write("connlimit", connlimit())
    with open(os.path.join(HERE, "connlimit_xt.rules"), "w") as f:
        f.write(CONNLIMIT_RULES)
    write("connlimit_xt", connlimit(v6=False))
    with open(os.path.join(HERE, "numgen.nft"), "w") as f:
        f.write(NUMGEN_NFT)
    write("numgen", numgen(range(7100, 7105), (6, 5, 4, 2, 2)))
    with open(os.path.join(HERE, "statistic.rules"), "w") as f:
        f.write(STATISTIC_RULES)
    write("statistic", numgen(range(7110, 7115), (6, 6, 4, 2, 2)))
    with open(os.path.join(HERE, "elem_quota.nft"), "w") as f:
        f.write(ELEM_QUOTA_NFT)
    write("elem_quota", elem_quota())
    with open(os.path.join(HERE, "named_objects.nft"), "w") as f:
        f.write(NAMED_OBJECTS_NFT)
    write("named_objects", named_objects())
    with open(os.path.join(HERE, "time_matches.nft"), "w") as f:
        f.write(TIME_MATCHES_NFT)
    write("time_matches", time_matches())
    with open(os.path.join(HERE, "time_xt.rules"), "w") as f:
        f.write(TIME_XT_RULES)
    write("time_xt", numgen(range(7500, 7506), (1, 1, 1, 1, 1, 1)))
    with open(os.path.join(HERE, "object_maps.nft"), "w") as f:
        f.write(OBJECT_MAPS_NFT)
    write("object_maps", object_maps())
    with open(os.path.join(HERE, "notrack.nft"), "w") as f:
        f.write(NOTRACK_NFT)
    write("notrack", notrack())
    with open(os.path.join(HERE, "ct_tuple.nft"), "w") as f:
        f.write(CT_TUPLE_NFT)
    write("ct_tuple", ct_tuple())
    with open(os.path.join(HERE, "ct_tuple_xt.rules"), "w") as f:
        f.write(CT_TUPLE_XT_RULES)
    write("ct_tuple_xt", ct_tuple())
    with open(os.path.join(HERE, "frag_off.nft"), "w") as f:
        f.write(FRAG_OFF_NFT)
    write("frag_off", frag_off())


if __name__ == "__main__":
    main()
