"""Each signed relay message is accepted once: the web server remembers the nonces it has
seen for as long as a message carrying them could still pass the signature's age check,
so a captured message cannot be played again."""

import threading
import time
from collections import OrderedDict


class NonceRegister:
    """Nonces seen in the last `remember_s` seconds (in this process: the relay is served
    only by the one web server of the one-machine mode)."""

    def __init__(self, remember_s: float):
        self.remember_s = remember_s
        self._expiry: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def first_use(self, nonce: str) -> bool:
        """True the first time `nonce` is seen within the window, False after."""
        now = time.monotonic()
        with self._lock:
            while self._expiry and next(iter(self._expiry.values())) <= now:
                self._expiry.popitem(last=False)
            if nonce in self._expiry:
                return False
            self._expiry[nonce] = now + self.remember_s
            return True

    def __len__(self) -> int:
        return len(self._expiry)
