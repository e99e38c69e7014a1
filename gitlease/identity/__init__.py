"""Who wrote a lease: SSHSIG signatures (sshsig), the signer the service sees (signer), and the trust file
that says which key may write for which agent (trust). Stands on gitlease.core only.
"""
