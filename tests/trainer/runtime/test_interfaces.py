"""A rank's collectives use the interface of its node's Ray address, unless the node's
config names one."""

import socket

from trainer.runtime.interfaces import interface_of, pin_socket_interfaces


def an_address_of_this_machine() -> tuple[str, str]:
    for _, name in socket.if_nameindex():
        if name != "lo" and (found := interface_of_any(name)):
            return name, found
    return "lo", "127.0.0.1"


def interface_of_any(name: str) -> str | None:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()))
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def test_the_interface_holding_an_address_is_found():
    assert interface_of("127.0.0.1") == "lo"
    name, address = an_address_of_this_machine()
    assert interface_of(address) == name
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: on no interface here


def test_gloo_and_nccl_are_pointed_at_it_unless_the_node_names_one():
    environ: dict[str, str] = {}
    assert pin_socket_interfaces("127.0.0.1", environ) == "lo"
    assert environ == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    chosen = {"GLOO_SOCKET_IFNAME": "eth7"}
    assert pin_socket_interfaces("127.0.0.1", chosen) == "eth7"
    assert chosen == {"GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "lo"}
    unknown: dict[str, str] = {}
    assert pin_socket_interfaces("203.0.113.77", unknown) is None and unknown == {}
