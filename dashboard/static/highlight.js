// Syntax highlighting for the run's script, done by the page itself: a small JavaScript
// tokenizer (comments, strings, template literals, numbers, keywords, SwarmBase's own
// functions), numbered lines, and the failing line of a failed run marked.
(function () {
  "use strict";
  const KEYWORDS = new Set(("await async break case catch class const continue debugger default delete do else export " +
    "extends false finally for function if import in instanceof let new null of return static super switch this throw " +
    "true try typeof undefined var void while yield").split(" "));
  const API = new Set("agent parallel pipeline phase log args budget meta workflow".split(" "));
  // One sticky regex per token kind, tried in order at each position.
  const RULES = [
    ["com", /\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)/y],
    ["str", /'(?:[^'\\\n]|\\.)*'?|"(?:[^"\\\n]|\\.)*"?|`(?:[^`\\]|\\[\s\S])*`?/y],
    ["num", /\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?n?)\b/y],
    ["word", /[A-Za-z_$][\w$]*/y],
    ["other", /[^A-Za-z_$0-9'"`\/]+|\//y],
  ];

  function tokens(text) {
    const out = [];
    let i = 0;
    while (i < text.length) {
      let matched = false;
      for (const [kind, re] of RULES) {
        re.lastIndex = i;
        const m = re.exec(text);
        if (!m || !m[0]) continue;
        let k = kind;
        if (kind === "word") {
          if (KEYWORDS.has(m[0])) k = "kw";
          else if (API.has(m[0])) k = "api";
          else if (/^\s*\(/.test(text.slice(i + m[0].length, i + m[0].length + 3))) k = "fn";
          else k = null;
        } else if (kind === "other") k = null;
        out.push([k, m[0]]);
        i += m[0].length;
        matched = true;
        break;
      }
      if (!matched) { out.push([null, text[i]]); i++; }
    }
    return out;
  }

  // Lines of highlighted spans; a token spanning lines is split at each newline.
  SB.highlight = function (pre, errorLine) {
    const code = pre.querySelector("code") || pre;
    const text = code.textContent;
    const lines = [[]];
    for (const [kind, value] of tokens(text)) {
      value.split("\n").forEach((part, j) => {
        if (j > 0) lines.push([]);
        if (part) lines[lines.length - 1].push(kind ? SB.el("span", { class: "k-" + kind, text: part }) : document.createTextNode(part));
      });
    }
    if (lines.length > 1 && !lines[lines.length - 1].length) lines.pop();
    const frag = document.createDocumentFragment();
    lines.forEach((parts, i) => {
      const n = i + 1;
      const line = SB.el("span", { class: "ln" + (n === errorLine ? " err" : ""), "data-n": n, id: "L" + n }, ...parts);
      if (!parts.length) line.append("\u200b");
      if (n === errorLine) line.title = "the run failed here";
      frag.append(line);
    });
    code.replaceChildren(frag);
    pre.classList.add("highlighted");
  };
})();
