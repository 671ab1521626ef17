"""Tool hosts: small processes run inside an agent's sandbox that execute its tools."""
