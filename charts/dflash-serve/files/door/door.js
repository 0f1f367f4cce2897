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

function keyOk(r) {
    const names = (r.variables.dflash_key_names || '').split(' ').filter(function (n) {
        return n !== '';
    });
    if (names.length === 0) {
        return '1'; // no keys configured: the door only enforces the allow-list
    }
    const given = presented(r);
    if (!given) {
        return '0';
    }
    const want = digest(given);
    for (var i = 0; i < names.length; i++) {
        var key;
        try {
            key = fs.readFileSync(r.variables.dflash_keys_dir + '/' + names[i], 'utf8').trim();
        } catch (e) {
            continue; // an optional key (the next one) that is not in the Secret
        }
        if (key && digest(key) === want) {
            return '1';
        }
    }
    return '0';
}

export default { keyOk };
