"""Which network interface a rank's collectives use. gloo (and NCCL) otherwise take the
address the machine's hostname resolves to, often 127.0.0.1, and ranks on two nodes
then cannot find each other ("Gloo connectFullMesh failed ... remote=[127.0.0.1]"). A
rank uses the interface that holds its node's Ray address; `GLOO_SOCKET_IFNAME` or
`NCCL_SOCKET_IFNAME` set for the node (`env_configs`' env_vars) overrides it."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import MutableMapping

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(address: str) -> str | None:
    """The name of this machine's interface whose IPv4 address is `address`, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def pin_socket_interfaces(
    address: str, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Point gloo and NCCL at the interface holding `address`, unless the node's config
    names one; the interface now in use by gloo (None: left to the library)."""
    environ = os.environ if environ is None else environ
    found = interface_of(address)
    for variable in SOCKET_INTERFACE_VARIABLES:
        if not environ.get(variable) and found is not None:
            environ[variable] = found
    return environ.get("GLOO_SOCKET_IFNAME")
