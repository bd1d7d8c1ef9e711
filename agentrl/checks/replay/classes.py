"""The classes a failed gold replay falls in, and what one replay returns (`agentrl.checks.replay`)."""
from __future__ import annotations

import re

OURS, DATA, NETWORK, HOST = "our defect", "data defect", "needs the network", "host limit"
"""our defect: a difference of ours to fix; data defect: the sample cannot pass in AgentBench-FC's own
setup either; needs the network: it installs or downloads; host limit: it needs more of the host than
this worker may give its sandboxes."""
NETWORK_COMMANDS = re.compile(r"\b(apt(-get)?|pip3?|curl|wget|git clone|npm|ping|nslookup|dig)\b")

Outcome = tuple[bool, str, str]  # (passed, class, evidence)
