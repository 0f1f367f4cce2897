// The door's key check (nginx.conf: js_set $dflash_key_ok). The keys are files in a directory
// (a mounted Secret in the chart), read on every request: a Secret the kubelet updates, or a
// file `local up` rewrites, is in force for the next request, without a reload.
// Comparing digests keeps the time a comparison takes independent of how much of a key matched.
const fs = require('fs');
const crypto = require('crypto');

function digest(text) {
    return crypto.createHash('sha256').update(text).digest('hex');
}

function presented(r) {
    const auth = r.headersIn['Authorization'] || '';
    const bearer = /^Bearer[ \t]+([^ \t]+)[ \t]*$/i.exec(auth);
    return bearer ? bearer[1] : '';
}

// The configured keys, read from their files now.
function keys(r) {
    const names = (r.variables.dflash_key_names || '').split(' ').filter(function (n) {
        return n !== '';
    });
    const found = [];
    for (var i = 0; i < names.length; i++) {
        try {
            var key = fs.readFileSync(r.variables.dflash_keys_dir + '/' + names[i], 'utf8').trim();
            if (key) {
                found.push(key);
            }
        } catch (e) {
            // an optional key (the next one) that is not in the Secret
        }
    }
    return { configured: names.length > 0, values: found };
}

function keyOk(r) {
    const known = keys(r);
    if (!known.configured) {
        return '1'; // no keys configured: the door only enforces the allow-list
    }
    const given = presented(r);
    if (!given) {
        return '0';
    }
    const want = digest(given);
    for (var i = 0; i < known.values.length; i++) {
        if (digest(known.values[i]) === want) {
            return '1';
        }
    }
    return '0';
}

// Query parameters that carry credentials by their name.
const CREDENTIAL_PARAMETER = /^(api[-_]?key|key|access[-_]?token|token|auth|authorization|bearer|password|secret)$/i;

function decoded(text) {
    try {
        return decodeURIComponent(text.replace(/\+/g, ' '));
    } catch (e) {
        return text;
    }
}

// '0' when the URL carries a credential: a parameter named like one, or one of the keys
// anywhere in the path or the query. Such a request is refused before it is proxied, so the
// key reaches no log (nginx's error log and vLLM's access log both print the request line).
function urlOk(r) {
    const raw = r.variables.request_uri || '';
    const query = r.variables.args || '';
    if (query) {
        const parameters = query.split('&');
        for (var i = 0; i < parameters.length; i++) {
            if (CREDENTIAL_PARAMETER.test(decoded(parameters[i].split('=')[0]))) {
                return '0';
            }
        }
    }
    const plain = decoded(raw);
    const known = keys(r).values;
    for (var j = 0; j < known.length; j++) {
        if (raw.indexOf(known[j]) >= 0 || plain.indexOf(known[j]) >= 0) {
            return '0';
        }
    }
    return '1';
}

export default { keyOk, urlOk };
