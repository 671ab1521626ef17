export const meta = {
  name: 'release-notes',
  description: 'Draft release notes for a version given as a string argument',
  phases: [{ title: 'Gather' }, { title: 'Draft' }, { title: 'Polish' }],
}

// The resident calls it with the version as a plain string: args = "0.3.2".
const VERSION = typeof args === 'string' && args.length ? args : 'next'
const SOURCES = ['docs/CHANGES.md', 'pyproject.toml', 'README.md']

const ENTRY = {
  type: 'object',
  properties: {
    headline: { type: 'string' },
    bullets: { type: 'array', items: { type: 'string' }, maxItems: 2 },
    breaking: { type: 'boolean' },
    seen: { type: 'string' },
  },
  required: ['headline', 'bullets', 'breaking'],
}

phase('Gather')
const facts = await parallel(
  SOURCES.map((src) => () => agent(`What does ${src} say about the release after the current version?`, {
    label: `gather:${src}`,
  })),
)
const usable = facts.filter((f) => typeof f === 'string' && f.length > 0)
log(`gathered ${usable.length} of ${SOURCES.length}`)

phase('Draft')
const draft = await agent(
  `Draft release notes for ${VERSION} from docs/CHANGES.md. Facts: ${usable.map((f) => f.split('\n')[0]).join(' / ')}`,
  { label: 'draft', schema: ENTRY },
)

phase('Polish')
let text = null
if (draft) {
  const lines = [`# ${VERSION}: ${draft.headline}`, ...draft.bullets.map((b) => `- ${b}`)]
  if (draft.breaking) lines.push('', '**Breaking changes inside.**')
  text = lines.join('\n')
}
const polished = text ? await agent(`Polish these notes, keep the bullets:\n${text}`, { label: 'polish' }) : null

return { version: VERSION, breaking: draft ? draft.breaking : null, text, polished, seen: draft && draft.seen }
