// A JGit git:// daemon for doctor's measurements (tests/test_race_probe.py, docs/hosts.md). Run with Java 11+ in
// source-file mode: java -cp <jgit.jar>:<slf4j-api.jar>:<JavaEWAH.jar> tests/JGitDaemon.java PORT BASE [reftable]
// serves every BASE/*.git (receive-pack on), converted to reftable first when asked; says READY on stdout and
// stops when its stdin closes.
import java.io.File;
import java.net.InetSocketAddress;
import org.eclipse.jgit.internal.storage.file.FileRepository;
import org.eclipse.jgit.transport.Daemon;
import org.eclipse.jgit.transport.resolver.FileResolver;

public class JGitDaemon {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        File base = new File(args[1]);
        if (args.length > 2 && args[2].equals("reftable")) {
            for (File f : base.listFiles()) {
                if (f.getName().endsWith(".git")) {
                    FileRepository repo = new FileRepository(f);
                    repo.convertRefStorage("reftable", false, false);
                    repo.close();
                }
            }
        }
        Daemon daemon = new Daemon(new InetSocketAddress("127.0.0.1", port));
        daemon.getService("git-receive-pack").setEnabled(true);
        daemon.setRepositoryResolver(new FileResolver<>(base, true));
        daemon.start();
        System.out.println("READY");
        System.out.flush();
        while (System.in.read() != -1) {
        }
        daemon.stop();
        System.exit(0);
    }
}
