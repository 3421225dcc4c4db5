"""The limits block's two loads: which keys and client addresses the calls spread over, with which limits.

- `uniform` (the block's first mix, kept as it was): 1,000 keys at 20/second (burst 20), 1,000 client addresses
  at 1,000/minute, each call on a key and an address drawn evenly.
- `skewed` (issue 26, closer to a many-tenant fleet): 10,000 keys, the hottest 1% (100 keys) making half the
  calls, each key 20/second with a burst of 40 and a quota of 100,000 calls a day; 10,000 client addresses at
  1,000/minute, drawn evenly.

Each product gets the same limits in its own words (`key_limits`): QueryAPIGate 0.43.0 has no burst setting (its
bucket holds the rate's N, `ratelimit.py`), so its skewed keys hold 20 where ours hold 40; envoy's fixed windows
(loadtests/peers/fixed_window.py) have no burst either and read the same key documents as our gateway.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KEY_RATE = 20                  # calls a second per key
IP_RATE = '1000/minute'
IP_PER_S = 1000 / 60


@dataclass(frozen=True)
class Mix:
    name: str
    keys: int
    hot_keys: int              # the first hot_keys keys take hot_share of the calls (0: every key alike)
    hot_share: float
    client_ips: int
    burst: int                 # our gateway's (and the exact reference's) bucket size per key
    quota: dict | None = field(default=None)

    def key_limits(self, product: str = 'gateway') -> dict:
        """The fields of a key's body that set its limits, for `product` ('gateway' or 'qag')."""
        limits: dict = {'rate_limit': f'{KEY_RATE}/second'}
        if product == 'gateway' and self.burst != KEY_RATE:
            limits['rate_limit_burst'] = self.burst
        if self.quota:
            limits['quota'] = dict(self.quota)
        return limits

    def wrk_env(self, keys_file: str, keys: int | None = None, hot: int | None = None) -> dict:
        """random_aid.lua's settings for this mix (`keys`: fewer keys than the mix, a smoke run; `hot`: the hot
        set's size when it is not the mix's share of `keys`)."""
        env = {'KEYS_FILE': keys_file, 'CLIENT_IPS': str(self.client_ips)}
        hot = self.hot(keys) if hot is None else hot
        if hot:
            env.update(HOT_KEYS=str(hot), HOT_SHARE=str(self.hot_share))
        return env

    def hot(self, keys: int | None = None) -> int:
        """The hot set's size with `keys` keys (the same share of them as in the full mix)."""
        if not self.hot_keys:
            return 0
        total = keys or self.keys
        return max(1, round(total * self.hot_keys / self.keys))

    def describe(self, keys: int | None = None, hot: int | None = None) -> str:
        total = keys or self.keys
        hot = self.hot(keys) if hot is None else hot
        spread = (f'the hottest {hot:,} making {self.hot_share:.0%} of the calls' if self.hot_keys
                  else 'every key equally likely')
        quota = f', a quota of {self.quota["calls"]:,} calls a {self.quota["per"]}' if self.quota else ''
        return (f'{total:,} keys at {KEY_RATE}/second (burst {self.burst}{quota}), {spread}; '
                f'{self.client_ips:,} client addresses at {IP_RATE}, drawn evenly')


UNIFORM = Mix('uniform', keys=1000, hot_keys=0, hot_share=0.0, client_ips=1000, burst=KEY_RATE)
SKEWED = Mix('skewed', keys=10_000, hot_keys=100, hot_share=0.5, client_ips=10_000, burst=2 * KEY_RATE,
             quota={'calls': 100_000, 'per': 'day'})
MIXES = {m.name: m for m in (UNIFORM, SKEWED)}


def chosen(option: str) -> list[Mix]:
    """--mix uniform|skewed|both."""
    if option == 'both':
        return [UNIFORM, SKEWED]
    return [MIXES[option]]

