export const meta = {
  name: 'agent-roster',
  description: "Describe the project's agent definitions from their files",
}

// Reads the project's agent files as files (no agentType): their content shapes the answer.
const DEFS = ['.claude/agents/executor.md', '.claude/agents/reviewer.md']
const ROLE = {
  type: 'object',
  properties: { role: { type: 'string' }, edits: { type: 'boolean' }, seen: { type: 'string' } },
  required: ['role', 'edits'],
}
const roles = await pipeline(DEFS, (d) => agent(`What is the role of the agent defined in ${d}?`, { label: d, schema: ROLE }))
return { roster: DEFS.map((d, i) => ({ file: d, ...(roles[i] || {}) })) }
